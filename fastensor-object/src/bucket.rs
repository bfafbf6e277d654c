//! One bucket's client, shared by the files opened in it.

use crate::config::ObjectConfig;
use object_store::aws::AmazonS3;
use std::sync::Arc;
use tokio::runtime::Runtime;
use tokio::sync::Semaphore;

/// One bucket's client and the limit on its requests in flight.
#[derive(Debug)]
pub(crate) struct Bucket {
    pub(crate) store: Arc<AmazonS3>,
    pub(crate) in_flight: Arc<Semaphore>,
    pub(crate) runtime: Arc<Runtime>,
    pub(crate) config: ObjectConfig,
}
