//! Where the daemon's rate-limited warnings come from (`crate::ratelog`).

pub use crate::ratelog::Every;
