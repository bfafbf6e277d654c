//! A load into new host memory is planned once from its opener's facts (a query) and
//! noted to it once, as the placement it ended with: a mapping refused (here: no read lease
//! while a writer has the file open) is read instead, never mapped again nor counted twice.

mod common;

use common::views;
use fastensor::checkpoint::{self, FileOpener};
use fastensor::core::policy::{NewLoadFacts, NewLoads};
use fastensor::posix::PosixBackend;
use fastensor::{Backend, BackendFile, Capabilities, DType, Engine, OpenMode, Result, TensorDesc};
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

/// Reads through `posix`, plans as an engine of local page-cache readers would (map), and
/// records what it is asked and told.
#[derive(Default)]
struct Recording {
    asked: AtomicUsize,
    noted: Mutex<Vec<NewLoads>>,
}

impl FileOpener for Recording {
    fn open_file(&self, path: &Path, mode: OpenMode) -> Result<Box<dyn BackendFile>> {
        PosixBackend.open_file(path, mode)
    }

    fn new_load_facts(&self) -> NewLoadFacts {
        self.asked.fetch_add(1, Relaxed);
        NewLoadFacts {
            readers: vec![Capabilities::local()],
            may_map: true,
            ..NewLoadFacts::default()
        }
    }

    fn note_new_load(&self, placement: NewLoads) {
        self.noted.lock().unwrap().push(placement);
    }
}

fn tensors() -> Vec<(TensorDesc, Vec<u8>)> {
    [1 << 20, 4097]
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let data: Vec<u8> = (0..len).map(|j| (j * 13 + i) as u8).collect();
            (
                TensorDesc::new(format!("t{i}"), DType::U8, [len as u64]),
                data,
            )
        })
        .collect()
}

#[test]
fn a_refused_mapping_is_planned_and_counted_once_as_the_read_that_replaced_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.safetensors");
    let t = tensors();
    checkpoint::save_checked(&PosixBackend, &path, &views(&t), &BTreeMap::new()).unwrap();
    let writer = OpenOptions::new().write(true).open(&path).unwrap();

    let opener = Recording::default();
    let refused = fastensor::sys::lease::stats().refused;
    let ckpt = checkpoint::load_verified(&opener, &path, None).unwrap();
    assert!(!ckpt.arena().is_mapped());
    assert_eq!(ckpt.tensor("t1").unwrap().1, &t[1].1[..]);
    assert_eq!(
        opener.asked.load(Relaxed),
        1,
        "the facts are asked for once"
    );
    assert_eq!(*opener.noted.lock().unwrap(), [NewLoads::Read]);
    assert_eq!(
        fastensor::sys::lease::stats().refused - refused,
        1,
        "the file is tried for a mapping once"
    );

    let (_, pending) = checkpoint::load_later(&opener, &path, Some(&["t0"])).unwrap();
    assert!(pending.is_none());
    assert_eq!(opener.asked.load(Relaxed), 2);
    assert_eq!(*opener.noted.lock().unwrap(), [NewLoads::Read; 2]);

    let engine = Engine::builder().build().unwrap();
    checkpoint::load(&engine, &path).unwrap();
    assert_eq!(engine.new_loads(), (0, 1));
    drop(writer);
    checkpoint::load(&engine, &path).unwrap();
    assert_eq!(engine.new_loads(), (1, 1));
}

#[test]
fn a_plain_backend_reads_and_a_pinned_engine_reads_through_its_pin() {
    let posix = PosixBackend.new_load_facts();
    assert!(posix.chosen);
    assert_eq!(
        fastensor::core::policy::plan_new_load(&posix),
        NewLoads::Read
    );
    let engine = Engine::builder().pin("posix").build().unwrap();
    let facts = engine.new_load_facts();
    assert!(facts.chosen);
    assert_eq!(facts.readers, [PosixBackend.capabilities()]);
    // Asking is no load: nothing is counted.
    assert_eq!(engine.new_loads(), (0, 0));
}
