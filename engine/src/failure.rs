//! What goes into error.json: a short error type and a message.

use std::fmt;

use vsnap_protocol::ProtocolError;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub error_type: &'static str,
    pub message: String,
}

impl Failure {
    pub fn new(error_type: &'static str, message: impl Into<String>) -> Self {
        Failure {
            error_type,
            message: message.into(),
        }
    }

    /// A failure of the engine itself (weights, memory, configuration).
    pub fn engine(message: impl Into<String>) -> Self {
        Failure::new("EngineError", message)
    }
}

impl From<ProtocolError> for Failure {
    fn from(e: ProtocolError) -> Self {
        let error_type = match e {
            ProtocolError::CanaryMismatch { .. } => "CanaryMismatch",
            ProtocolError::Timeout { .. } => "TimeoutError",
            _ => "ProtocolError",
        };
        Failure::new(error_type, e.to_string())
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.error_type, self.message)
    }
}
