//! mpsfleet's pure core: task definition validation, GPU placement and the clock seam.
//! Nothing here does I/O or reads the time by itself.

pub mod clock;
pub mod scheduler;
pub mod taskdef;
