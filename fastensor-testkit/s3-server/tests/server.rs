//! End-to-end tests of the `fastensor-s3-server` binary: startup line, signing, the
//! `/_faults` API and each fault kind, and the S3 operations a checkpoint client uses.

mod common;

use std::time::{Duration, Instant};

use common::{hex, Server};
use md5::{Digest, Md5};

const WRONG_ETAG: &str = "\"00000000000000000000000000000000\"";

fn md5_hex(data: &[u8]) -> String {
    hex(&Md5::digest(data))
}

/// `len` bytes that differ at every offset a range test reads.
fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 % 251) as u8).collect()
}

/// Text between `<tag>` and `</tag>`, first occurrence.
fn xml_field(xml: &str, tag: &str) -> Option<String> {
    let open = format!("<{tag}>");
    let start = xml.find(&open)? + open.len();
    let end = start + xml[start..].find(&format!("</{tag}>"))?;
    Some(xml[start..end].to_owned())
}

/// A bucket holding `key` = `data`, uploaded with PutObject.
fn put(server: &Server, bucket: &str, key: &str, data: &[u8]) {
    let reply = server.signed("PUT", &format!("/{bucket}"), &[], b"");
    assert!(
        reply.status == 200 || reply.text().contains("BucketAlreadyExists"),
        "CreateBucket: {} {}",
        reply.status,
        reply.text()
    );
    let reply = server.signed("PUT", &format!("/{bucket}/{key}"), &[], data);
    assert_eq!(reply.status, 200, "PutObject: {}", reply.text());
    assert_eq!(
        reply.header("etag"),
        Some(format!("\"{}\"", md5_hex(data)).as_str())
    );
}

#[test]
fn prints_its_url_creates_its_root_and_refuses_unsigned_requests() {
    let server = Server::start();
    let port: u16 = server
        .url
        .strip_prefix("http://127.0.0.1:")
        .expect("default listen address")
        .parse()
        .expect("a port");
    assert_ne!(port, 0);
    assert!(server.root.join("data").is_dir());

    let reply = server.raw("GET", "/bucket/key", &[], b"");
    assert_eq!(reply.status, 403, "{}", reply.text());
    assert!(reply.text().contains("<Code>AccessDenied</Code>"));
    assert_eq!(server.terminate().code(), Some(0));
}

#[test]
fn fault_api_adds_reports_and_clears_rules() {
    let server = Server::start();
    let report = server.fault_report();
    assert_eq!(report["fired"]["slow_down"], 0);
    assert_eq!(report["requests"]["GET"], 0);

    // Only GETs under /bkt/, once.
    server.add_fault(r#"{"kind": "slow_down", "method": "GET", "path_contains": "/bkt/"}"#);
    assert_eq!(server.raw("GET", "/other/k", &[], b"").status, 403);
    assert_eq!(server.raw("PUT", "/bkt/k", &[], b"x").status, 403);
    let reply = server.raw("GET", "/bkt/k", &[], b"");
    assert_eq!(reply.status, 503);
    assert_eq!(reply.header("content-type"), Some("application/xml"));
    assert_eq!(
        reply.text(),
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>SlowDown</Code>\
         <Message>Please reduce your request rate.</Message></Error>"
    );
    // Used up: the next one reaches s3s, which refuses it for lack of a signature.
    assert_eq!(server.raw("GET", "/bkt/k", &[], b"").status, 403);

    let report = server.fault_report();
    assert_eq!(report["fired"]["slow_down"], 1);
    assert_eq!(report["fired"]["drop"], 0);
    assert_eq!(report["requests"]["GET"], 3);
    assert_eq!(report["requests"]["PUT"], 1);
    assert_eq!(report["rules"].as_array().unwrap().len(), 0);

    // internal_error on a PUT with a body: answered after the body is read.
    server.add_fault(r#"{"kind": "internal_error", "method": "PUT", "times": 2}"#);
    for _ in 0..2 {
        let reply = server.raw("PUT", "/bkt/k", &[], &pattern(300_000));
        assert_eq!(reply.status, 500);
        assert!(reply.text().contains("<Code>InternalError</Code>"));
    }
    assert_eq!(server.raw("PUT", "/bkt/k", &[], b"x").status, 403);

    server.add_fault(r#"{"kind": "drop"}"#);
    assert_eq!(server.fault_report()["rules"][0]["kind"], "drop");
    let reply = server.raw("DELETE", "/_faults", &[], b"");
    assert_eq!(reply.status, 200);
    let report = server.fault_report();
    assert_eq!(report["fired"]["internal_error"], 0);
    assert_eq!(report["requests"]["PUT"], 0);
    assert_eq!(report["rules"].as_array().unwrap().len(), 0);
    // The cleared drop rule does not fire.
    assert_eq!(server.raw("GET", "/bkt/k", &[], b"").status, 403);

    for bad in [
        r#"{"kind": "explode"}"#,
        r#"{"kind": "delay"}"#,
        r#"{"kind": "drop", "times": 0}"#,
        "{",
    ] {
        let reply = server.raw("POST", "/_faults", &[], bad.as_bytes());
        assert_eq!(reply.status, 400, "{bad}");
        assert!(reply.text().contains("error"));
    }
    assert_eq!(server.raw("PUT", "/_faults", &[], b"").status, 405);
    assert_eq!(server.raw("GET", "/_faults/x", &[], b"").status, 404);
}

#[test]
fn signed_operations_for_checkpoint_loads() {
    let server = Server::start();
    let data = pattern(1000);
    put(&server, "ckpt", "dir/model.safetensors", &data);
    let etag = format!("\"{}\"", md5_hex(&data));

    let reply = server.signed("HEAD", "/ckpt/dir/model.safetensors", &[], b"");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("etag"), Some(etag.as_str()));
    assert_eq!(reply.content_length(), Some(1000));

    let reply = server.signed(
        "GET",
        "/ckpt/dir/model.safetensors",
        &[("range", "bytes=100-199")],
        b"",
    );
    assert_eq!(reply.status, 206);
    assert_eq!(reply.header("content-range"), Some("bytes 100-199/1000"));
    assert_eq!(reply.header("etag"), Some(etag.as_str()));
    assert_eq!(reply.body, &data[100..200]);

    let reply = server.signed(
        "GET",
        "/ckpt/dir/model.safetensors",
        &[("range", "bytes=-10")],
        b"",
    );
    assert_eq!(reply.status, 206);
    assert_eq!(reply.header("content-range"), Some("bytes 990-999/1000"));
    assert_eq!(reply.body, &data[990..]);

    let reply = server.signed("GET", "/ckpt/dir/model.safetensors", &[], b"");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, data);

    put(&server, "ckpt", "other.bin", b"abc");
    let reply = server.signed("GET", "/ckpt?list-type=2&prefix=dir%2F", &[], b"");
    assert_eq!(reply.status, 200, "{}", reply.text());
    let listing = reply.text();
    assert!(
        listing.contains("<Key>dir/model.safetensors</Key>"),
        "{listing}"
    );
    assert!(!listing.contains("other.bin"), "{listing}");
    assert!(listing.contains("<Size>1000</Size>"), "{listing}");

    let reply = server.signed("GET", "/ckpt/missing", &[], b"");
    assert_eq!(reply.status, 404);
    assert!(reply.text().contains("<Code>NoSuchKey</Code>"));

    let reply = server.signed("DELETE", "/ckpt/other.bin", &[], b"");
    assert_eq!(reply.status, 204);
    assert_eq!(
        server.signed("HEAD", "/ckpt/other.bin", &[], b"").status,
        404
    );

    // A signature for another region is refused, as AWS does.
    let reply = server.signed_for("eu-west-1", "GET", "/ckpt/dir/model.safetensors", &[], b"");
    assert_eq!(reply.status, 400);
    assert!(reply.text().contains("AuthorizationHeaderMalformed"));
}

#[test]
fn body_faults_on_signed_requests() {
    let server = Server::start();
    let data = pattern(1000);
    put(&server, "bkt", "obj", &data);

    server.add_fault(r#"{"kind": "truncate", "method": "GET"}"#);
    let reply = server.signed("GET", "/bkt/obj", &[], b"");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.content_length(), Some(1000));
    assert_eq!(reply.body, &data[..500], "exactly the first half");

    server.add_fault(r#"{"kind": "truncate"}"#);
    let reply = server.signed("GET", "/bkt/obj", &[("range", "bytes=0-0")], b"");
    assert_eq!(reply.status, 206);
    assert_eq!(reply.content_length(), Some(1));
    assert!(reply.body.is_empty(), "a 1-byte body is cut to nothing");

    server.add_fault(r#"{"kind": "wrong_etag", "method": "HEAD"}"#);
    let reply = server.signed("HEAD", "/bkt/obj", &[], b"");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("etag"), Some(WRONG_ETAG));
    server.add_fault(r#"{"kind": "wrong_etag", "method": "GET"}"#);
    let reply = server.signed("GET", "/bkt/obj", &[("range", "bytes=10-19")], b"");
    assert_eq!(reply.status, 206);
    assert_eq!(reply.header("etag"), Some(WRONG_ETAG));
    assert_eq!(reply.body, &data[10..20]);

    server.add_fault(r#"{"kind": "drop", "method": "GET"}"#);
    let reply = server.signed("GET", "/bkt/obj", &[], b"");
    assert_eq!(reply.status, 0, "no response at all");
    assert!(reply.body.is_empty());

    server.add_fault(r#"{"kind": "delay", "delay_ms": 300, "path_contains": "/bkt/obj"}"#);
    let start = Instant::now();
    let reply = server.signed("GET", "/bkt/obj", &[], b"");
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, data);

    // A failed PUT leaves the old object in place.
    server.add_fault(r#"{"kind": "slow_down", "method": "PUT"}"#);
    let reply = server.signed("PUT", "/bkt/obj", &[], b"new");
    assert_eq!(reply.status, 503);
    assert_eq!(server.signed("GET", "/bkt/obj", &[], b"").body, data);

    let report = server.fault_report();
    for (kind, n) in [
        ("truncate", 2),
        ("wrong_etag", 2),
        ("drop", 1),
        ("delay", 1),
        ("slow_down", 1),
    ] {
        assert_eq!(report["fired"][kind], n, "{kind}: {report}");
    }
}

#[test]
fn multipart_upload_complete_and_abort() {
    let server = Server::start();
    assert_eq!(server.signed("PUT", "/mpu", &[], b"").status, 200);

    let reply = server.signed("POST", "/mpu/big.bin?uploads=", &[], b"");
    assert_eq!(reply.status, 200, "{}", reply.text());
    let upload_id = xml_field(&reply.text(), "UploadId").expect("UploadId");

    // Every part but the last must be at least 5 MiB.
    let part1 = pattern(5 * 1024 * 1024);
    let part2 = b"the last part may be small".to_vec();
    let mut etags = Vec::new();
    for (n, part) in [(1, &part1), (2, &part2)] {
        let target = format!("/mpu/big.bin?partNumber={n}&uploadId={upload_id}");
        let reply = server.signed("PUT", &target, &[], part);
        assert_eq!(reply.status, 200, "UploadPart {n}: {}", reply.text());
        let etag = reply.header("etag").expect("part ETag").to_owned();
        assert_eq!(etag, format!("\"{}\"", md5_hex(part)));
        etags.push(etag);
    }
    let complete = format!(
        "<CompleteMultipartUpload>\
         <Part><PartNumber>1</PartNumber><ETag>{}</ETag></Part>\
         <Part><PartNumber>2</PartNumber><ETag>{}</ETag></Part>\
         </CompleteMultipartUpload>",
        etags[0], etags[1]
    );
    let target = format!("/mpu/big.bin?uploadId={upload_id}");
    let reply = server.signed("POST", &target, &[], complete.as_bytes());
    assert_eq!(reply.status, 200, "{}", reply.text());
    // S3's multipart ETag: md5 of the parts' binary md5s, then "-<part count>".
    let mut md5s = Vec::new();
    md5s.extend_from_slice(&Md5::digest(&part1));
    md5s.extend_from_slice(&Md5::digest(&part2));
    let expected = format!("\"{}-2\"", md5_hex(&md5s));
    let text = reply.text();
    let returned = xml_field(&text, "ETag").expect("ETag in the result");
    assert_eq!(returned.replace("&quot;", "\""), expected, "{text}");

    let reply = server.signed("HEAD", "/mpu/big.bin", &[], b"");
    assert_eq!(reply.header("etag"), Some(expected.as_str()));
    assert_eq!(reply.content_length(), Some(part1.len() + part2.len()));
    let offset = part1.len() - 3;
    let reply = server.signed(
        "GET",
        "/mpu/big.bin",
        &[("range", &format!("bytes={offset}-{}", offset + 9))],
        b"",
    );
    assert_eq!(reply.status, 206);
    let mut expected_bytes = part1[offset..].to_vec();
    expected_bytes.extend_from_slice(&part2[..7]);
    assert_eq!(reply.body, expected_bytes);

    // truncate on a body far larger than hyper's write buffer still delivers exactly half.
    server.add_fault(r#"{"kind": "truncate", "method": "GET"}"#);
    let reply = server.signed("GET", "/mpu/big.bin", &[], b"");
    let total = part1.len() + part2.len();
    assert_eq!(reply.content_length(), Some(total));
    assert_eq!(reply.body.len(), total / 2);
    assert_eq!(reply.body, &part1[..total / 2]);

    // Abort: the upload id is gone afterwards.
    let reply = server.signed("POST", "/mpu/aborted.bin?uploads=", &[], b"");
    let upload_id = xml_field(&reply.text(), "UploadId").expect("UploadId");
    let target = format!("/mpu/aborted.bin?partNumber=1&uploadId={upload_id}");
    assert_eq!(server.signed("PUT", &target, &[], b"part").status, 200);
    let target = format!("/mpu/aborted.bin?uploadId={upload_id}");
    assert_eq!(server.signed("DELETE", &target, &[], b"").status, 204);
    let target = format!("/mpu/aborted.bin?partNumber=2&uploadId={upload_id}");
    assert_ne!(server.signed("PUT", &target, &[], b"part").status, 200);
    assert_eq!(
        server.signed("HEAD", "/mpu/aborted.bin", &[], b"").status,
        404
    );
}
