//! Accessors for tools that drive a `Cluster` in-process (the fleet simulator): nothing here
//! is used by the server itself.

use super::*;

impl Cluster {
    /// Makes new task ids a pure function of `base` and the order in which tasks are created,
    /// instead of a random base chosen at load. Ids already taken are skipped as usual.
    pub fn reseed_task_ids(&mut self, base: u64) {
        self.ids = write::TaskIds { base, counter: 0 };
    }
}
