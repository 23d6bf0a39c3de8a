//! The canary oracle and its match rule: same token ids, same text, and a sampled-token
//! logprob within [`LOGPROB_TOLERANCE`] (absolute).

use crate::error::{ProtocolError, Result};
use crate::messages::Oracle;

/// Largest accepted |difference| between two canary logprobs.
pub const LOGPROB_TOLERANCE: f64 = 0.001;

impl Oracle {
    /// The shape rule: exactly one token, finite logprob.
    pub fn check(&self) -> std::result::Result<(), String> {
        if self.token_ids.len() != 1 {
            return Err(format!(
                "oracle must hold exactly one token, got {} token ids",
                self.token_ids.len()
            ));
        }
        if !self.sampled_token_logprob.is_finite() {
            return Err(format!(
                "oracle sampled_token_logprob {} is not finite",
                self.sampled_token_logprob
            ));
        }
        Ok(())
    }

    /// Compares an observed canary answer with this (expected) oracle. `context` names where
    /// the observation came from, for the error.
    pub fn check_matches(&self, observed: &Oracle, context: &str) -> Result<()> {
        let mismatch = |detail: String| ProtocolError::CanaryMismatch {
            context: context.to_string(),
            detail,
        };
        if observed.token_ids != self.token_ids {
            return Err(mismatch(format!(
                "token_ids {:?} != oracle {:?}",
                observed.token_ids, self.token_ids
            )));
        }
        if observed.text != self.text {
            return Err(mismatch(format!(
                "text {:?} != oracle {:?}",
                observed.text, self.text
            )));
        }
        let delta = (observed.sampled_token_logprob - self.sampled_token_logprob).abs();
        // NaN on either side makes `delta` NaN, which must be a mismatch too.
        if delta.is_nan() || delta > LOGPROB_TOLERANCE {
            return Err(mismatch(format!(
                "sampled_token_logprob {} != oracle {} (|difference| {:.6} > {})",
                observed.sampled_token_logprob,
                self.sampled_token_logprob,
                delta,
                LOGPROB_TOLERANCE
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oracle(token: u32, text: &str, logprob: f64) -> Oracle {
        Oracle {
            sampled_token_logprob: logprob,
            text: text.into(),
            token_ids: vec![token],
        }
    }

    #[test]
    fn equal_answers_match() {
        let expected = oracle(7, " P", -1.25);
        expected.check_matches(&expected.clone(), "canary").unwrap();
    }

    #[test]
    fn logprob_within_tolerance_matches() {
        let expected = oracle(7, " P", -1.25);
        expected
            .check_matches(&oracle(7, " P", -1.2509), "canary")
            .unwrap();
    }

    #[test]
    fn logprob_drift_names_both_values() {
        let expected = oracle(7, " P", -1.25);
        let err = expected
            .check_matches(&oracle(7, " P", -1.252), "recovery canary")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("recovery canary: canary mismatch:"),
            "{err}"
        );
        assert!(err.contains("-1.252") && err.contains("-1.25 "), "{err}");
    }

    #[test]
    fn token_mismatch_names_both_tokens() {
        let err = oracle(1234, "a", -1.0)
            .check_matches(&oracle(5678, "a", -1.0), "restore")
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "restore: canary mismatch: token_ids [5678] != oracle [1234]"
        );
    }

    #[test]
    fn text_mismatch_is_refused() {
        let err = oracle(1, "a", -1.0)
            .check_matches(&oracle(1, "b", -1.0), "x")
            .unwrap_err()
            .to_string();
        assert!(err.contains("text \"b\" != oracle \"a\""), "{err}");
    }

    #[test]
    fn nan_logprob_never_matches() {
        let err = oracle(1, "a", -1.0).check_matches(&oracle(1, "a", f64::NAN), "x");
        assert!(err.is_err());
    }

    #[test]
    fn oracle_shape_requires_one_finite_token() {
        assert!(oracle(1, "a", -1.0).check().is_ok());
        assert!(oracle(1, "a", f64::INFINITY).check().is_err());
        let mut two = oracle(1, "a", -1.0);
        two.token_ids.push(2);
        assert!(two.check().is_err());
    }
}
