//! The `microvm` backend: each run's agent in a virtual machine of its own
//! (QEMU's `-M microvm`), whose one way out is a virtio-serial port that the
//! runtime's relays are multiplexed over to the sidecar outside.

pub mod image;
