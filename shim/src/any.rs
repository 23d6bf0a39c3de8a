//! `Any` packing without protobuf reflection: containerd-shim's
//! `convert_to_any` names the type through `descriptor_dyn()`, which links
//! every message's descriptor and the reflection machinery into the shim.
//! Here each type the shim sends names its full name itself.

use containerd_shim_protos::cgroups::metrics::Metrics as MetricsV1;
use containerd_shim_protos::cgroups_v2::metrics::Metrics as MetricsV2;
use containerd_shim_protos::events::task::{
    TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskOOM, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::Message;
use containerd_shim_protos::shim::oci::ProcessDetails;

/// A message with its protobuf full name (the `Any`'s type URL, as
/// containerd-shim writes it: without a host prefix).
pub trait Named: Message {
    const FULL_NAME: &'static str;
}

macro_rules! named {
    ($($t:ty => $name:literal),* $(,)?) => {
        $(impl Named for $t {
            const FULL_NAME: &'static str = $name;
        })*
    };
}

named! {
    TaskCreate => "containerd.events.TaskCreate",
    TaskStart => "containerd.events.TaskStart",
    TaskDelete => "containerd.events.TaskDelete",
    TaskExit => "containerd.events.TaskExit",
    TaskOOM => "containerd.events.TaskOOM",
    TaskExecAdded => "containerd.events.TaskExecAdded",
    TaskExecStarted => "containerd.events.TaskExecStarted",
    TaskPaused => "containerd.events.TaskPaused",
    TaskResumed => "containerd.events.TaskResumed",
    ProcessDetails => "containerd.runc.v1.ProcessDetails",
    MetricsV1 => "io.containerd.cgroups.v1.Metrics",
    MetricsV2 => "io.containerd.cgroups.v2.Metrics",
}

/// `message` in an `Any`.
pub fn pack<M: Named>(message: &M) -> containerd_shim_protos::protobuf::Result<Any> {
    let mut any = Any::new();
    any.type_url = M::FULL_NAME.to_string();
    any.value = message.write_to_bytes()?;
    Ok(any)
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim_protos::protobuf::MessageFull;

    /// The names written here are the descriptors' (reflection is fine in a test).
    #[test]
    fn every_name_is_the_descriptors() {
        fn same<M: Named + MessageFull>() {
            assert_eq!(M::FULL_NAME, M::descriptor().full_name());
        }
        same::<TaskCreate>();
        same::<TaskStart>();
        same::<TaskDelete>();
        same::<TaskExit>();
        same::<TaskOOM>();
        same::<TaskExecAdded>();
        same::<TaskExecStarted>();
        same::<TaskPaused>();
        same::<TaskResumed>();
        same::<ProcessDetails>();
        same::<MetricsV1>();
        same::<MetricsV2>();
    }

    #[test]
    fn packed_bytes_are_the_messages() {
        let exit = TaskExit {
            container_id: "c".into(),
            exit_status: 3,
            ..Default::default()
        };
        let any = pack(&exit).unwrap();
        assert_eq!(any.type_url, "containerd.events.TaskExit");
        assert_eq!(TaskExit::parse_from_bytes(&any.value).unwrap(), exit);
    }
}
