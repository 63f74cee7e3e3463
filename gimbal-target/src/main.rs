//! The `gimbal-target` command.

fn main() {}
