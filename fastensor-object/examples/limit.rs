//! The raw limit of a server, for the object-storage benchmark: parallel ranged GETs of an
//! object, each response copied into its place in one buffer faulted in before the clock
//! starts (as the local benchmark's raw `O_DIRECT` read lands in memory faulted in first: no
//! fresh memory, no tensors, no header), or a parallel multipart upload of one
//! preallocated buffer sent again and again (no copies). Whatever fastensor does on top of
//! this is measured against it.
//!
//! ```text
//! limit get s3://bucket/key [REQUEST_BYTES] [CONCURRENCY]
//! limit put s3://bucket/key BYTES [PART_BYTES] [CONCURRENCY]
//! ```
//! Prints one JSON line: `{"op", "bytes", "seconds", "gbps"}`. Endpoint and credentials
//! from the environment (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, ...).

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::multipart::MultipartStore;
use object_store::{ClientOptions, GetOptions, GetRange, ObjectStore};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: limit get|put s3://bucket/key [...]";
    let (op, url) = (args.first().ok_or(usage)?, args.get(1).ok_or(usage)?);
    let rest = url.strip_prefix("s3://").ok_or(usage)?;
    let (bucket, key) = rest.split_once('/').ok_or(usage)?;
    let arg = |i: usize, default: u64| -> u64 {
        args.get(i)
            .map(|v| fastensor_core::size::parse_size(v).expect("a size"))
            .unwrap_or(default)
    };
    let http = std::env::var("AWS_ENDPOINT_URL").is_ok_and(|e| e.starts_with("http://"));
    let store = AmazonS3Builder::from_env()
        .with_bucket_name(bucket)
        .with_client_options(ClientOptions::new().with_allow_http(http))
        .build()?;
    let key = object_store::path::Path::from(key);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut start = Instant::now();
    let bytes = match op.as_str() {
        "get" => {
            let (request, concurrency) = (arg(2, 8 << 20), arg(3, 16) as usize);
            let size = rt.block_on(store.head(&key))?.size;
            // Faulted in before the clock starts.
            let mut memory = vec![1u8; size as usize];
            start = Instant::now();
            rt.block_on(async {
                let pieces: Vec<(u64, &mut [u8])> = memory
                    .chunks_mut(request as usize)
                    .enumerate()
                    .map(|(i, piece)| (i as u64 * request, piece))
                    .collect();
                futures::stream::iter(pieces)
                    .map(|(a, piece)| {
                        let store = &store;
                        let key = &key;
                        async move {
                            let b = a + piece.len() as u64;
                            let opts = GetOptions {
                                range: Some(GetRange::Bounded(a..b)),
                                ..Default::default()
                            };
                            let mut body = store.get_opts(key, opts).await?.into_stream();
                            let mut n = 0usize;
                            while let Some(chunk) = body.next().await {
                                let chunk = chunk?;
                                piece[n..n + chunk.len()].copy_from_slice(&chunk);
                                n += chunk.len();
                            }
                            Ok::<u64, object_store::Error>(n as u64)
                        }
                    })
                    .buffer_unordered(concurrency)
                    .try_fold(0u64, |sum, n| async move { Ok(sum + n) })
                    .await
            })?
        }
        "put" => {
            let total = arg(2, 1 << 30);
            let (part, concurrency) = (arg(3, 16 << 20), arg(4, 16) as usize);
            let buf = Bytes::from(vec![0x5au8; part as usize]);
            rt.block_on(async {
                let id = store.create_multipart(&key).await?;
                let parts = total.div_ceil(part);
                let ids: Vec<_> = futures::stream::iter(0..parts)
                    .map(|i| {
                        let len = (total - i * part).min(part) as usize;
                        let data = buf.slice(..len);
                        let (store, key, id) = (&store, &key, &id);
                        async move { store.put_part(key, id, i as usize, data.into()).await }
                    })
                    .buffered(concurrency)
                    .try_collect()
                    .await?;
                store.complete_multipart(&key, &id, ids).await?;
                Ok::<u64, object_store::Error>(total)
            })?
        }
        _ => return Err(usage.into()),
    };
    let seconds = start.elapsed().as_secs_f64();
    println!(
        r#"{{"op": "{op}", "bytes": {bytes}, "seconds": {seconds:.4}, "gbps": {:.3}}}"#,
        bytes as f64 / seconds / 1e9
    );
    Ok(())
}
