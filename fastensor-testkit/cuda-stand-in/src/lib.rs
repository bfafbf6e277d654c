//! A stand-in for the CUDA driver (`libcuda.so.1`) and cuFile (`libcufile.so.0`) that runs on
//! any Linux machine, with no GPU. It lets fastensor's CUDA code (`fastensor-gds`: the `gds`
//! and `cuda-staged` backends, device buffers, the cuFile batch API) run in every test run.
//!
//! It checks the code's **logic, ordering, bounds and error handling, not GPU speed**: "device
//! memory" is host memory, and every figure measured against it says nothing about a GPU.
//!
//! # How it is found
//!
//! Exactly as a user's driver is: the dynamic loader finds this one library under the names
//! `libcuda.so.1`, `libcuda.so`, `libcufile.so.0` and `libcufile.so` in `LD_LIBRARY_PATH`
//! (the `run` script next to this crate builds it, makes those links and runs a command).
//! Both names are one loaded library, so cuFile sees the driver's memory.
//!
//! # What it models
//!
//! * **Device memory** lives in this library's own table. Device pointers are addresses in a
//!   reserved range that is mapped with no access (`PROT_NONE`): host code that dereferences
//!   one is stopped by `SIGSEGV`, as on a GPU it would read garbage. The copy calls translate
//!   them, and a copy that leaves its allocation is refused and counted. New allocations are
//!   filled with `0xDB`, not zeros.
//! * **Asynchronous copies** run on one worker thread per stream, in order, each after a short
//!   delay (`FASTENSOR_STAND_IN_DELAY_US`, default 50 µs): a buffer reused before its event
//!   completed, or freed before its stream drained, shows as wrong bytes or a violation.
//! * **Pinned host memory** (`cuMemHostAlloc`, `cuMemHostRegister`) is counted; freeing it or
//!   device memory while a copy still uses it is a violation (the free then waits).
//! * **cuFile** reads and writes the registered descriptor (through aligned bounce buffers
//!   when it was opened with `O_DIRECT`), in compatibility mode; the batch API completes its
//!   requests on a worker thread.
//! * **Contexts**: every call that needs a current context on the calling thread fails with
//!   `CUDA_ERROR_INVALID_CONTEXT` (and is counted) when there is none. In a child made by
//!   `fork` every call fails with `CUDA_ERROR_NOT_INITIALIZED`, as CUDA's do.
//! * Every other entry point of the driver and cuFile is exported, returns an error
//!   (`CUDA_ERROR_NOT_SUPPORTED`, `CU_FILE_IO_NOT_SUPPORTED`) and is counted.
//!
//! # Environment
//!
//! * `FASTENSOR_STAND_IN_FAULT`: faults to inject, comma-separated (see [`config`]):
//!   `read-error@N`, `short-read@N`, `zero-read@N`, `write-error@N` (cuFile reads or writes
//!   from the N-th on, counting from 0), `batch-fail@N` (batch requests), `pinned-oom@N`,
//!   `device-oom@N` (allocations), `device-lost@BYTES` (the device is lost once that many
//!   bytes moved to or from device memory; `K`, `M`, `G` suffixes allowed).
//! * `FASTENSOR_STAND_IN_DEVICES` (default 1), `FASTENSOR_STAND_IN_DEVICE_MEMORY` and
//!   `FASTENSOR_STAND_IN_PINNED_MEMORY` (bytes; default 8G and 4G), `FASTENSOR_STAND_IN_MAX_BATCH`
//!   (default 128), `FASTENSOR_STAND_IN_DELAY_US`.
//! * `FASTENSOR_STAND_IN_STATS=PATH`: the counters are written there when the process exits
//!   (`%p` in PATH becomes the process id).
//! * A missing symbol (an older driver or cuFile) cannot come from a variable of a library
//!   that is already loaded: the `run` script's `FASTENSOR_STAND_IN_MISSING=NAME,...` links a
//!   copy of this library whose symbol tables no longer hold those names.
//!
//! The counters (calls, live pinned buffers, streams, handles, violations, unimplemented
//! calls, faults fired) are also returned by the exported function
//! [`fastensor_stand_in_stats`], one `name value` pair a line.
#![deny(missing_docs)]
// The exported functions keep the C API's names.
#![allow(non_snake_case)]

pub mod config;
mod context;
mod copies;
mod cufile;
mod cufile_batch;
mod driver;
mod driver_memory;
mod driver_streams;
mod errors;
mod handles;
mod memory;
mod stats;
mod streams;
mod unimplemented;

pub use stats::fastensor_stand_in_stats;
