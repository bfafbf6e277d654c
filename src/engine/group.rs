//! Whether the ranks of a process group read a checkpoint once between them and broadcast
//! it (each byte from storage once, moved to the other ranks by the group's collectives), or
//! each read all of it: a decision with a context, measured and learned like the choice of a
//! backend (the same selector, the same profile), with a rule where the answer is known.
//!
//! The rule: one rank, or ranks that all share one host and read a local file, read each on
//! their own: their reads share the page cache, so each byte comes from storage once anyway
//! and a broadcast would only add copies. Elsewhere (object storage, ranks on several hosts)
//! which wins depends on the storage's bandwidth per rank against the collectives': the
//! selector explores both in the context (bytes, ranks, hosts, where the bytes come from)
//! and keeps the faster, watching it for drift as it does backends.

use super::Engine;
use fastensor_core::{
    CacheState, Direction, Error, ErrorKind, FileLocation, MemoryKind, Purpose, Result,
    TransferContext,
};
use std::sync::Arc;
use std::time::Duration;

/// How the ranks of a group read a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GroupRead {
    /// Each byte read by one rank, then broadcast to the others.
    Broadcast,
    /// Every rank reads all it needs on its own.
    Each,
}

impl GroupRead {
    /// Both, in the order explored.
    pub const ALL: [GroupRead; 2] = [GroupRead::Broadcast, GroupRead::Each];

    /// Its name: `"broadcast"` or `"each"` (what [`parse`](Self::parse) takes).
    pub fn name(self) -> &'static str {
        match self {
            GroupRead::Broadcast => "broadcast",
            GroupRead::Each => "each",
        }
    }

    /// The way named `name`; anything else is [`ErrorKind::InvalidInput`] listing the names.
    pub fn parse(name: &str) -> Result<GroupRead> {
        GroupRead::ALL
            .into_iter()
            .find(|g| g.name() == name)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidInput,
                    format!("unknown group read `{name}` (expected `broadcast`, `each` or `auto`)"),
                )
            })
    }
}

/// Where a group's checkpoint comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupSource {
    /// Local files (their file system and device): ranks of one host share its page cache.
    Files(FileLocation),
    /// An object store (its scheme and host, e.g. `s3://bucket`): nothing is shared.
    Objects(String),
}

impl GroupSource {
    /// Where the checkpoint at `path` (a file, a sharded checkpoint's index or directory, or
    /// an object URL) comes from.
    pub fn of(path: &std::path::Path) -> GroupSource {
        match super::opener::resolve(path) {
            fastensor_core::location::Location::Object(url) => {
                GroupSource::Objects(format!("{}://{}", url.scheme, url.bucket))
            }
            fastensor_core::location::Location::File(p) => {
                GroupSource::Files(fastensor_sys::file_location(p))
            }
        }
    }
}

/// The context of a group load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupContext {
    /// Ranks in the group.
    pub ranks: u32,
    /// Distinct hosts among them.
    pub hosts: u32,
    /// Bytes of the tensors loaded.
    pub bytes: u64,
    /// Where the tensors go.
    pub memory: MemoryKind,
    /// Where the bytes come from.
    pub source: GroupSource,
}

/// The engine's answer for a group load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupChoice {
    /// How to read.
    pub read: GroupRead,
    /// True while the context is being explored (this load is a measurement).
    pub exploring: bool,
    /// Why, in words (`"rule: ..."` or `"learned"` / `"exploring"`).
    pub reason: String,
}

impl GroupContext {
    /// The rule's answer and its reason, where one applies (see the module's
    /// documentation): the same on every rank of a group, which needs no word from rank 0.
    pub fn rule(&self) -> Option<(GroupRead, &'static str)> {
        if self.ranks <= 1 {
            return Some((GroupRead::Each, "one rank"));
        }
        if self.hosts <= 1 && matches!(self.source, GroupSource::Files(_)) {
            return Some((
                GroupRead::Each,
                "ranks of one host reading local files share the page cache",
            ));
        }
        None
    }

    /// The selector's context for this load: learned apart from every transfer's (its
    /// location names the group's shape and the source).
    fn transfer_context(&self) -> TransferContext {
        let (fs, device) = match &self.source {
            GroupSource::Files(l) => (l.fs_type.clone(), l.device.clone()),
            GroupSource::Objects(store) => ("objects".to_string(), store.clone()),
        };
        let location = FileLocation::new(
            format!("group:{fs}"),
            format!("{}r/{}h/{device}", self.ranks, self.hosts),
        );
        TransferContext {
            direction: Direction::Read,
            bytes: self.bytes,
            memory: self.memory,
            location: Arc::new(location),
            in_flight: self.ranks,
            purpose: Purpose::Checkpoint,
            cache: CacheState::Cold,
        }
    }
}

impl Engine {
    /// How the ranks of a group should read a checkpoint in `ctx`: the rule where it
    /// applies, else what the selector learned (exploring both first).
    pub fn choose_group_read(&self, ctx: &GroupContext) -> GroupChoice {
        if let Some((read, why)) = ctx.rule() {
            return GroupChoice {
                read,
                exploring: false,
                reason: format!("rule: {why}"),
            };
        }
        let names = GroupRead::ALL.map(GroupRead::name);
        let tctx = ctx.transfer_context();
        let choice = self.inner.measurer.selector().choose(&tctx, &names);
        match choice.and_then(|c| GroupRead::parse(&c.backend).ok().map(|r| (r, c))) {
            Some((read, c)) => GroupChoice {
                read,
                exploring: c.exploring,
                reason: if c.exploring { "exploring" } else { "learned" }.to_string(),
            },
            None => GroupChoice {
                read: GroupRead::Broadcast,
                exploring: false,
                reason: "default".to_string(),
            },
        }
    }

    /// Teaches the selector a group load in `ctx` done `read`'s way in `wall` (until every
    /// rank held every tensor). Loads the rule decides teach nothing.
    pub fn record_group_read(&self, ctx: &GroupContext, read: GroupRead, wall: Duration) {
        if ctx.rule().is_some() {
            return;
        }
        let tctx = ctx.transfer_context();
        let mut sel = self.inner.measurer.selector();
        sel.record_wall_only(&tctx, read.name(), ctx.bytes, wall);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn objects(ranks: u32) -> GroupContext {
        GroupContext {
            ranks,
            hosts: 1,
            bytes: 1 << 30,
            memory: MemoryKind::Host,
            source: GroupSource::Objects("s3://bucket".into()),
        }
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for g in GroupRead::ALL {
            assert_eq!(GroupRead::parse(g.name()).unwrap(), g);
        }
        let e = GroupRead::parse("scatter").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.to_string().contains("scatter"));
    }

    #[test]
    fn one_host_reading_files_reads_each_by_rule() {
        let engine = Engine::new().unwrap();
        let mut ctx = objects(4);
        ctx.source = GroupSource::Files(FileLocation::new("ext4", "8:0"));
        let c = engine.choose_group_read(&ctx);
        assert_eq!(c.read, GroupRead::Each);
        assert!(c.reason.starts_with("rule"));
        ctx.hosts = 2;
        assert!(!engine.choose_group_read(&ctx).reason.starts_with("rule"));
        assert_eq!(engine.choose_group_read(&objects(1)).read, GroupRead::Each);
    }

    /// Loads whose time is `broadcast` or `each` seconds per GiB teach the engine the faster.
    fn learned(broadcast: f64, each: f64) -> GroupRead {
        let engine = Engine::new().unwrap();
        let ctx = objects(4);
        for _ in 0..40 {
            let c = engine.choose_group_read(&ctx);
            let secs = match c.read {
                GroupRead::Broadcast => broadcast,
                GroupRead::Each => each,
            };
            engine.record_group_read(&ctx, c.read, Duration::from_secs_f64(secs));
        }
        let last = engine.choose_group_read(&ctx);
        assert!(!last.exploring, "still exploring after 40 loads");
        last.read
    }

    #[test]
    fn the_faster_way_is_learned_either_way() {
        assert_eq!(learned(1.0, 4.0), GroupRead::Broadcast);
        assert_eq!(learned(3.0, 1.0), GroupRead::Each);
    }
}
