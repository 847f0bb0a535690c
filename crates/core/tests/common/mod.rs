//! What the core's integration tests share; each test binary compiles it and uses a part of it.
#![allow(dead_code, reason = "each test binary uses a part of it")]

pub mod ops;
