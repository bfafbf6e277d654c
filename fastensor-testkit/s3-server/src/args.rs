//! The command line, parsed by hand (two forms per flag: `--flag VALUE`, `--flag=VALUE`).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;

/// The usage text printed by `--help` and after a command-line error.
pub const USAGE: &str = "\
usage: fastensor-s3-server --root DIR [--listen 127.0.0.1:0] [--access-key fastensor]
                           [--secret-key fastensor-secret] [--region us-east-1]
                           [--bandwidth BYTES_PER_SECOND] [--anonymous]

A local S3-compatible server with fault injection, for tests and benchmarks only.
Serves DIR (each subdirectory is a bucket; DIR is created if missing), path-style, SigV4
signed with the given keys. Prints `http://ADDR:PORT` on one line once listening, then
serves until SIGTERM or SIGINT. Faults are controlled over HTTP at /_faults (see README).
With --bandwidth, all response bodies together go out at most that fast (a shared
storage or network bottleneck); GET /_faults reports the body bytes sent. With
--anonymous, unsigned requests are served too: Google Cloud Storage's XML API (the same
REST protocol) as a GCS client speaks it to an emulator, with no credentials.";

/// The server's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Args {
    /// The directory served.
    pub root: PathBuf,
    /// Where to listen; port 0 picks a free one.
    pub listen: SocketAddr,
    /// The one access key accepted.
    pub access_key: String,
    /// Its secret key.
    pub secret_key: String,
    /// The region SigV4 signatures must name.
    pub region: String,
    /// Bytes a second for all response bodies together (`None`: unpaced).
    pub bandwidth: Option<u64>,
    /// Unsigned requests are served too.
    pub anonymous: bool,
}

/// Why the command line was not accepted.
#[derive(Debug, PartialEq, Eq)]
pub enum ArgsError {
    /// `-h` or `--help` was given.
    Help,
    /// Anything else, with the message to print.
    Invalid(String),
}

impl Args {
    /// Parses the arguments after the program name.
    ///
    /// # Errors
    /// [`ArgsError::Help`] for `-h`/`--help`; [`ArgsError::Invalid`] for an unknown flag, a
    /// flag without its value, a value that is not UTF-8 (paths excepted), an invalid
    /// `--listen` address, or a missing `--root`.
    pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Args, ArgsError> {
        let invalid = |m: String| ArgsError::Invalid(m);
        let mut root = None;
        let mut listen = SocketAddr::from(([127, 0, 0, 1], 0));
        let mut access_key = "fastensor".to_owned();
        let mut secret_key = "fastensor-secret".to_owned();
        let mut region = "us-east-1".to_owned();
        let mut bandwidth = None;
        let mut anonymous = false;

        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let arg = arg
                .into_string()
                .map_err(|a| invalid(format!("not a flag: {a:?}")))?;
            if arg == "-h" || arg == "--help" {
                return Err(ArgsError::Help);
            }
            if arg == "--anonymous" {
                anonymous = true;
                continue;
            }
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) if flag.starts_with("--") => {
                    (flag.to_owned(), Some(OsString::from(value)))
                }
                _ => (arg, None),
            };
            if !matches!(
                flag.as_str(),
                "--root"
                    | "--listen"
                    | "--access-key"
                    | "--secret-key"
                    | "--region"
                    | "--bandwidth"
            ) {
                return Err(invalid(format!("unknown argument {flag:?}")));
            }
            let value = inline
                .or_else(|| args.next())
                .ok_or_else(|| invalid(format!("{flag} needs a value")))?;
            if flag == "--root" {
                root = Some(PathBuf::from(value));
                continue;
            }
            let value = value
                .into_string()
                .map_err(|v| invalid(format!("{flag}: not UTF-8: {v:?}")))?;
            match flag.as_str() {
                "--listen" => {
                    listen = value
                        .parse()
                        .map_err(|e| invalid(format!("--listen {value:?}: {e}")))?;
                }
                "--access-key" => access_key = value,
                "--secret-key" => secret_key = value,
                "--bandwidth" => {
                    let b: u64 = value
                        .parse()
                        .map_err(|e| invalid(format!("--bandwidth {value:?}: {e}")))?;
                    bandwidth = Some(b).filter(|&b| b > 0);
                }
                _ => region = value,
            }
        }
        let root = root.ok_or_else(|| invalid("--root DIR is required".to_owned()))?;
        Ok(Args {
            root,
            listen,
            access_key,
            secret_key,
            region,
            bandwidth,
            anonymous,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Args, ArgsError> {
        Args::parse(args.iter().map(OsString::from))
    }

    #[test]
    fn defaults_and_both_flag_forms() {
        let a = parse(&["--root", "/tmp/x"]).unwrap();
        assert_eq!(a.root, PathBuf::from("/tmp/x"));
        assert_eq!(a.listen, "127.0.0.1:0".parse().unwrap());
        assert_eq!(a.access_key, "fastensor");
        assert_eq!(a.secret_key, "fastensor-secret");
        assert_eq!(a.region, "us-east-1");

        let a = parse(&[
            "--root=/d",
            "--listen=0.0.0.0:9000",
            "--access-key",
            "ak",
            "--secret-key=sk",
            "--region",
            "eu-west-1",
        ])
        .unwrap();
        assert_eq!(a.root, PathBuf::from("/d"));
        assert_eq!(a.listen, "0.0.0.0:9000".parse().unwrap());
        assert_eq!((a.access_key.as_str(), a.secret_key.as_str()), ("ak", "sk"));
        assert_eq!(a.region, "eu-west-1");
        assert_eq!(a.bandwidth, None);
        let a = parse(&["--root=/d", "--bandwidth", "200000000"]).unwrap();
        assert_eq!(a.bandwidth, Some(200_000_000));
        assert!(matches!(
            parse(&["--root=/d", "--bandwidth", "fast"]),
            Err(ArgsError::Invalid(_))
        ));
    }

    #[test]
    fn rejects_bad_command_lines() {
        assert_eq!(parse(&["--help"]), Err(ArgsError::Help));
        assert!(matches!(parse(&[]), Err(ArgsError::Invalid(_))));
        assert!(matches!(parse(&["--root"]), Err(ArgsError::Invalid(_))));
        assert!(matches!(
            parse(&["--root", "d", "--port", "1"]),
            Err(ArgsError::Invalid(_))
        ));
        assert!(matches!(
            parse(&["--root", "d", "--listen", "localhost"]),
            Err(ArgsError::Invalid(_))
        ));
        assert!(matches!(parse(&["d"]), Err(ArgsError::Invalid(_))));
    }
}
