//! Decisions made from what backends declare ([`Capabilities`]), never from their names:
//! where a load into new host memory puts its bytes ([`plan_new_load`]), which backend reads
//! a job nothing was learned for ([`default_reader`]), and which explorations a job may be
//! ([`may_explore`]). Every function here is pure: its caller gathers the facts and counts
//! what was done, so a backend added through the registry becomes a default by what it
//! declares.

use crate::{CacheState, Capabilities};

/// Where a load of a whole checkpoint into new host memory puts its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NewLoads {
    /// The file mapped copy-on-write, its pages brought in by the I/O threads: no zeroing,
    /// and no read at all where the pages are cached already.
    Mapped,
    /// Fresh memory, faulted in and read into through a backend.
    Read,
}

impl NewLoads {
    /// Its name in a profile.
    pub fn as_str(self) -> &'static str {
        match self {
            NewLoads::Mapped => "mapped",
            NewLoads::Read => "read",
        }
    }
}

/// What a load of a whole checkpoint into new host memory is planned from
/// ([`plan_new_load`]): what an opener ([`FileOpener::new_load_facts`]) says of itself.
///
/// [`FileOpener::new_load_facts`]: crate::FileOpener::new_load_facts
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewLoadFacts {
    /// What the backends the load's reads may go through declare.
    pub readers: Vec<Capabilities>,
    /// The caller chose the backend every read goes through (a plain backend, a pinned
    /// engine): the load reads through it.
    pub chosen: bool,
    /// Whether the opener lets loads into new memory map the file at all.
    pub may_map: bool,
    /// The placement measured faster on this machine (`fastensor tune`), when measured.
    pub measured: Option<NewLoads>,
    /// Where a mapped load can have no read lease on its file (a writer has it open, the
    /// file system grants none, another user's file): whether it maps the file anyway, its
    /// memory then unprotected from changes to the file, rather than reading it.
    pub unprotected_maps: bool,
}

/// Where a load into new host memory puts its bytes: mapped, unless the opener forbids it,
/// the caller chose the backend, `fastensor tune` measured reading faster here, or none of
/// the readers reads local files through the page cache (then the caller chose to bypass
/// it, or the opener's files are not local files). Mapping never costs more device reads
/// than reading, and spares what reading into new memory costs on top: the kernel zeroing
/// every page before the read overwrites it.
pub fn plan_new_load(facts: &NewLoadFacts) -> NewLoads {
    let map = facts.may_map
        && !facts.chosen
        && facts.measured != Some(NewLoads::Read)
        && facts
            .readers
            .iter()
            .any(Capabilities::reads_local_page_cache);
    if map {
        NewLoads::Mapped
    } else {
        NewLoads::Read
    }
}

/// The backend (index into `offered`) that reads a job nothing was learned for, in `cache`
/// state: for a cold (or unknown) file one that bypasses the page cache, for a cached one
/// one that copies from it; then one that reads through system calls rather than a
/// mapping (no page faults); then the deepest queue; then the first offered. `None` when
/// nothing is offered.
pub fn default_reader(cache: CacheState, offered: &[Capabilities]) -> Option<usize> {
    let rank = |c: &Capabilities| {
        let suits = c.bypasses_page_cache != (cache == CacheState::Cached);
        (suits, !c.maps_file, c.queue_depth)
    };
    offered
        .iter()
        .enumerate()
        .max_by_key(|&(i, c)| (rank(c), std::cmp::Reverse(i)))
        .map(|(i, _)| i)
}

/// Whether an exploration of `reader` may measure a job in `cache` state whose destination
/// is `fresh` memory: not when it would send a cold read into fresh memory through the page
/// cache (the copy and the faults would be measured, then kept as the page cache's cost).
pub fn may_explore(cache: CacheState, fresh: bool, reader: &Capabilities) -> bool {
    !(fresh && cache != CacheState::Cached && reader.reads_through_page_cache())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page_cache() -> Capabilities {
        Capabilities::local()
    }

    fn mapping() -> Capabilities {
        Capabilities {
            write: false,
            maps_file: true,
            ..Capabilities::local()
        }
    }

    fn direct(queue_depth: u32) -> Capabilities {
        Capabilities::direct(queue_depth)
    }

    fn engine(readers: Vec<Capabilities>) -> NewLoadFacts {
        NewLoadFacts {
            readers,
            may_map: true,
            ..NewLoadFacts::default()
        }
    }

    #[test]
    fn a_new_load_maps_where_a_reader_reads_local_files_through_the_page_cache() {
        assert_eq!(
            plan_new_load(&engine(vec![direct(4), page_cache()])),
            NewLoads::Mapped
        );
        assert_eq!(plan_new_load(&engine(vec![mapping()])), NewLoads::Mapped);
    }

    #[test]
    fn a_new_load_reads_otherwise() {
        // Only paths past the page cache: the caller chose to bypass it.
        assert_eq!(
            plan_new_load(&engine(vec![direct(16), direct(4)])),
            NewLoads::Read
        );
        // Files that are not local files (an in-memory backend, a remote store).
        assert_eq!(
            plan_new_load(&engine(vec![Capabilities::default()])),
            NewLoads::Read
        );
        // Device memory only.
        let device = Capabilities::local().on_device();
        assert_eq!(plan_new_load(&engine(vec![device])), NewLoads::Read);
        assert_eq!(plan_new_load(&engine(Vec::new())), NewLoads::Read);
        let readers = vec![page_cache()];
        let chosen = NewLoadFacts {
            chosen: true,
            ..engine(readers.clone())
        };
        assert_eq!(plan_new_load(&chosen), NewLoads::Read);
        let off = NewLoadFacts {
            may_map: false,
            ..engine(readers.clone())
        };
        assert_eq!(plan_new_load(&off), NewLoads::Read);
        let measured = |m| NewLoadFacts {
            measured: Some(m),
            ..engine(readers.clone())
        };
        assert_eq!(plan_new_load(&measured(NewLoads::Read)), NewLoads::Read);
        assert_eq!(plan_new_load(&measured(NewLoads::Mapped)), NewLoads::Mapped);
        // A plain opener's default facts read.
        assert_eq!(plan_new_load(&NewLoadFacts::default()), NewLoads::Read);
    }

    #[test]
    fn a_cold_job_reads_past_the_page_cache_deepest_queue_first() {
        let offered = [page_cache(), mapping(), direct(4), direct(16)];
        for cache in [CacheState::Cold, CacheState::Unknown] {
            assert_eq!(default_reader(cache, &offered), Some(3));
            assert_eq!(default_reader(cache, &offered[..3]), Some(2));
            assert_eq!(default_reader(cache, &offered[..2]), Some(0));
            assert_eq!(default_reader(cache, &offered[1..2]), Some(0));
        }
    }

    #[test]
    fn a_cached_job_copies_from_the_page_cache_through_system_calls_first() {
        let offered = [direct(4), direct(16), mapping(), page_cache()];
        assert_eq!(default_reader(CacheState::Cached, &offered), Some(3));
        assert_eq!(default_reader(CacheState::Cached, &offered[..3]), Some(2));
        assert_eq!(default_reader(CacheState::Cached, &offered[..2]), Some(1));
        assert_eq!(default_reader(CacheState::Cached, &[]), None);
    }

    #[test]
    fn equal_readers_keep_the_order_offered() {
        let offered = [direct(4), direct(4)];
        assert_eq!(default_reader(CacheState::Cold, &offered), Some(0));
    }

    #[test]
    fn no_exploration_sends_a_cold_read_into_fresh_memory_through_the_page_cache() {
        assert!(!may_explore(CacheState::Cold, true, &page_cache()));
        assert!(!may_explore(CacheState::Unknown, true, &mapping()));
        assert!(may_explore(CacheState::Cold, true, &direct(4)));
        assert!(may_explore(CacheState::Cold, false, &page_cache()));
        assert!(may_explore(CacheState::Cached, true, &page_cache()));
    }
}
