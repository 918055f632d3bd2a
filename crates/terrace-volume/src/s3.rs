//! [`S3Backend`]: a [`Backend`] over an S3 bucket (AWS, or any S3-compatible server), as
//! fixed-size chunk objects, through `object_store`'s S3 client on a private tokio
//! runtime.
//!
//! Layout under `PREFIX` in `BUCKET` ([`S3Config`]):
//! - `PREFIX/volume`: a small text object recording the volume's size and chunk size,
//!   written when the volume is first opened; a later open with another size or chunk
//!   size is refused ([`VolumeError::Config`]) rather than reading a layout it does not
//!   know. A grown volume's object also records the size it was created with, and opens
//!   with either (its size is the recorded one).
//! - Snapshots: `PREFIX.snap-TAG/…` (`snap-TAG/…` for a volume at the bucket's top), a
//!   copy of the chunk objects made by the server (CopyObject), its `volume` object
//!   copied last — so a snapshot is itself a volume, and one without its `volume` object
//!   is unfinished (a retry clears it first).
//! - `PREFIX/<chunk index as 16 hex digits>`: bytes `[index × chunk, (index + 1) × chunk)`
//!   of the volume (the last chunk is shorter when the size is not a multiple of the
//!   chunk size). A chunk that does not exist reads as zeroes; a chunk whose content
//!   becomes all zeroes (a trim, a write of zeroes) is deleted.
//!
//! What it owns: the S3 client, the runtime whose worker threads drive its connections
//! (2 to 4 threads named `terrace-s3`), and the per-chunk queues that order updates.
//!
//! Invariants:
//! - **Every acknowledged `write_at` or `trim` is a completed PUT or DELETE.** Nothing is
//!   buffered: an update returns once S3 has answered for every chunk it touched, so
//!   [`Backend::flush`] has nothing to wait for and returns at once. (S3 itself is
//!   durable and strongly read-after-write consistent once it has answered.)
//! - **Updates of one chunk are serialised**: a write or trim of part of a chunk is a
//!   read-modify-write (GET, merge, PUT), and two of them on one chunk must not lose each
//!   other. Each chunk in use has a queue: updates arriving while one caller (the leader)
//!   has the chunk's GET/PUT in flight wait in the queue, and the next leader — one of
//!   the waiters — applies the whole queue in one GET and one PUT (group commit), in the
//!   order the updates arrived. A caller returns once the round holding its update is
//!   done, with that round's outcome. An update covering the whole chunk needs no GET:
//!   a whole-chunk write is one PUT, a whole-chunk trim one DELETE.
//! - Reads take no lock: a PUT replaces a whole object atomically, so a read sees each
//!   chunk either before or after an update, never a torn one.
//! - **Bounded time**: every S3 request is abandoned after [`S3Config::timeout`] (retries
//!   included), so a stalled or stopped server is an error, not a hang. A request that
//!   timed out may still have been applied, as with any failed write to a device.
//! - Any byte range inside [`Backend::size`] is accepted (the volume hands 4 KiB-aligned
//!   ones); a range past it is `InvalidInput` (EINVAL), as for the other backends.
//! - One call keeps at most [`PARALLEL_CHUNKS`] chunk requests in flight at once.
//!
//! Why nothing is buffered: the volume in front already is the write buffer (its log
//! batches writes and flushes the backend after each batch), and the queues merge the
//! updates that arrive together on one chunk; a second layer of dirty data here would
//! need its own bound, its own crash story and a read path through it, for writes the
//! volume hands over in runs of up to 1 MiB anyway.
//!
//! Two processes opening one new prefix at once may both write the metadata object (the
//! last one wins); one volume belongs to one `serve-volume` at a time.
//!
//! The trait is synchronous: each call blocks its thread on the runtime (`block_on`),
//! which many threads may do at once (the write-back writes from up to 64). A call made
//! from inside another tokio runtime, where `block_on` is not allowed, blocks on a helper
//! thread instead.
//!
//! Credentials come from the standard AWS environment (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, or the web-identity, container and
//! instance sources `object_store` knows), unless [`S3Config::credentials`] is set.

use std::fmt;
use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig};
use parking_lot::{Condvar, Mutex};
use rustc_hash::FxHashMap;

use crate::backend::{Backend, BLOCK_SIZE};
use crate::error::VolumeError;

/// The chunk size when the URI names none: 1 MiB.
pub const DEFAULT_CHUNK_SIZE: u64 = 1 << 20;
/// The largest chunk size accepted (each read-modify-write holds a chunk in memory).
pub const MAX_CHUNK_SIZE: u64 = 64 << 20;
/// How long one S3 request may take, retries included, when the URI names no timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The most chunk requests (GET, PUT, DELETE) one call keeps in flight.
pub const PARALLEL_CHUNKS: usize = 32;
/// The metadata object's name under the prefix.
const METADATA: &str = "volume";
/// The metadata object's first line; the format's version is its last word.
const METADATA_MAGIC: &str = "terrace-volume s3 chunks 1";
/// Stripes of the chunk queues' map (each a mutex and a condition variable).
const STRIPES: usize = 256;

/// Explicit S3 credentials (instead of the environment's). The secret is not printed.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

/// Where an S3 volume lives and how it is laid out; [`S3Config::from_uri`] parses the
/// `s3://` form `terrace serve-volume --backend` takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct S3Config {
    pub bucket: String,
    /// The key prefix of the volume's objects, without leading or trailing `/` (may be
    /// empty: the bucket's top level).
    pub prefix: String,
    /// The S3 endpoint (`http://127.0.0.1:9000`); `None`: AWS (or `AWS_ENDPOINT`). Plain
    /// HTTP is allowed when the endpoint is `http://`.
    pub endpoint: Option<String>,
    /// `None`: `AWS_REGION` / `AWS_DEFAULT_REGION`, else `us-east-1`.
    pub region: Option<String>,
    /// Bytes per chunk object: a multiple of 4 KiB, at most [`MAX_CHUNK_SIZE`].
    pub chunk_size: u64,
    /// The volume's size: a multiple of 4 KiB, fixed when the volume is first opened.
    pub size: u64,
    /// The longest one S3 request may take, retries included.
    pub timeout: Duration,
    /// `None`: the standard AWS environment (see the module docs).
    pub credentials: Option<S3Credentials>,
}

impl S3Config {
    /// A volume of `size` bytes under `prefix` in `bucket`, with the defaults.
    pub fn new(bucket: &str, prefix: &str, size: u64) -> S3Config {
        S3Config {
            bucket: bucket.to_string(),
            prefix: prefix.trim_matches('/').to_string(),
            endpoint: None,
            region: None,
            chunk_size: DEFAULT_CHUNK_SIZE,
            size,
            timeout: DEFAULT_TIMEOUT,
            credentials: None,
        }
    }

    /// Parses `s3://BUCKET[/PREFIX]?size=SIZE[&chunk=SIZE][&endpoint=URL][&region=R]
    /// [&timeout=DURATION]`: sizes as `1GiB`, `4MiB`; durations as `30s`, `500ms`, `2m`.
    /// `size` is required: nothing else says how large a new volume is.
    pub fn from_uri(uri: &str) -> Result<S3Config, String> {
        let rest = uri
            .strip_prefix("s3://")
            .ok_or_else(|| format!("{uri:?}: an S3 backend is s3://BUCKET/PREFIX?size=SIZE"))?;
        let (location, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = location.split_once('/').unwrap_or((location, ""));
        if bucket.is_empty() {
            return Err(format!("{uri:?}: no bucket (s3://BUCKET/PREFIX?size=SIZE)"));
        }
        let mut config = S3Config::new(bucket, prefix, 0);
        let mut size = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once('=')
                .ok_or_else(|| format!("{uri:?}: {pair:?} is not KEY=VALUE"))?;
            let value = percent_decode(value).map_err(|e| format!("{uri:?}: {key}: {e}"))?;
            let bad = |e: String| format!("{uri:?}: {key}: {e}");
            match key {
                "size" => size = Some(terrace_cache::spec::parse_size(&value).map_err(bad)?),
                "chunk" => {
                    config.chunk_size = terrace_cache::spec::parse_size(&value).map_err(bad)?
                }
                "endpoint" => config.endpoint = Some(value),
                "region" => config.region = Some(value),
                "timeout" => config.timeout = parse_duration(&value).map_err(bad)?,
                other => {
                    return Err(format!(
                        "{uri:?}: unknown setting {other:?} (size, chunk, endpoint, region, \
                         timeout)"
                    ))
                }
            }
        }
        config.size = size.ok_or_else(|| {
            format!(
                "{uri:?}: an S3 volume needs its size, e.g. {uri}{}size=1GiB",
                if query.is_empty() { "?" } else { "&" }
            )
        })?;
        config.validate().map_err(|e| format!("{uri:?}: {e}"))?;
        Ok(config)
    }

    /// The `s3://` URI of the volume (without the settings), for messages.
    pub fn location(&self) -> String {
        if self.prefix.is_empty() {
            format!("s3://{}", self.bucket)
        } else {
            format!("s3://{}/{}", self.bucket, self.prefix)
        }
    }

    fn validate(&self) -> Result<(), String> {
        let bs = BLOCK_SIZE as u64;
        if self.bucket.is_empty() {
            return Err("no bucket".into());
        }
        if self.size == 0 || !self.size.is_multiple_of(bs) {
            return Err(format!(
                "the size ({} bytes) must be a positive multiple of {BLOCK_SIZE}",
                self.size
            ));
        }
        if self.chunk_size == 0
            || !self.chunk_size.is_multiple_of(bs)
            || self.chunk_size > MAX_CHUNK_SIZE
        {
            return Err(format!(
                "the chunk size ({} bytes) must be a multiple of {BLOCK_SIZE} up to {} MiB",
                self.chunk_size,
                MAX_CHUNK_SIZE >> 20
            ));
        }
        if self.timeout.is_zero() {
            return Err("the timeout must not be zero".into());
        }
        if let Some(endpoint) = &self.endpoint {
            if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
                return Err(format!("endpoint {endpoint:?} is not http:// or https://"));
            }
        }
        Ok(())
    }
}

/// What a chunk update writes: bytes, or zeroes (a trim).
enum Content {
    Bytes(Vec<u8>),
    Zeroes(usize),
}

/// One caller's change to one chunk, waiting in the chunk's queue.
struct Update {
    /// Offset inside the chunk.
    start: usize,
    content: Content,
}

impl Update {
    fn len(&self) -> usize {
        match &self.content {
            Content::Bytes(data) => data.len(),
            Content::Zeroes(len) => *len,
        }
    }
}

/// An error every caller of a round gets (io::Error is not Clone).
#[derive(Clone)]
struct SharedError {
    kind: io::ErrorKind,
    message: String,
}

impl SharedError {
    fn to_io(&self) -> io::Error {
        io::Error::new(self.kind, self.message.clone())
    }
}

/// The updates applied together by one leader; its outcome is set once, when done.
#[derive(Default)]
struct Round {
    outcome: OnceLock<Result<(), SharedError>>,
}

/// A chunk in use: its queue and whether a leader is updating it.
struct ChunkQueue {
    /// A leader has this chunk's GET/PUT/DELETE in flight.
    busy: bool,
    /// Updates for the next round, in arrival order.
    queued: Vec<Update>,
    /// The round `queued` will go in.
    round: Arc<Round>,
    /// Callers with an update here whose outcome they have not yet taken; the entry is
    /// removed when none is left.
    users: usize,
}

#[derive(Default)]
struct Stripe {
    chunks: Mutex<FxHashMap<u64, ChunkQueue>>,
    changed: Condvar,
}

/// A caller's update in a chunk's queue, until it has the outcome of its round.
struct Ticket {
    chunk: u64,
    round: Arc<Round>,
    outcome: Option<Result<(), SharedError>>,
}

/// Requests an [`S3Backend`] has sent (each counted once, whatever its retries).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct S3Requests {
    pub gets: u64,
    pub puts: u64,
    pub deletes: u64,
    /// Read-modify-write rounds that applied more than one caller's update at once.
    pub merged_rounds: u64,
}

#[derive(Default)]
struct Counters {
    gets: AtomicU64,
    puts: AtomicU64,
    deletes: AtomicU64,
    merged_rounds: AtomicU64,
}

/// A volume stored as chunk objects in S3. See the module docs.
pub struct S3Backend {
    config: S3Config,
    /// The volume's size: the metadata object's (grows, [`Backend::grow`]).
    size: AtomicU64,
    /// The size the volume was created with (the metadata object's `created`, else its
    /// size).
    created: AtomicU64,
    counters: Counters,
    store: AmazonS3,
    prefix: Path,
    /// Always `Some` until dropped (taken to shut it down without waiting).
    runtime: Option<tokio::runtime::Runtime>,
    stripes: Box<[Stripe]>,
}

impl S3Backend {
    /// Opens the volume at `config`: checks the bucket answers, and creates the metadata
    /// object, or checks that the one there records the same size and chunk size.
    pub fn open(config: S3Config) -> Result<S3Backend, VolumeError> {
        let location = config.location();
        config
            .validate()
            .map_err(|e| VolumeError::Config(format!("{location}: {e}")))?;
        let prefix = if config.prefix.is_empty() {
            Path::default()
        } else {
            Path::parse(&config.prefix).map_err(|e| {
                VolumeError::Config(format!("{location}: not a usable key prefix: {e}"))
            })?
        };
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&config.bucket)
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(config.timeout)
                    .with_connect_timeout(config.timeout.min(Duration::from_secs(5)))
                    .with_allow_http(
                        config
                            .endpoint
                            .as_deref()
                            .is_some_and(|e| e.starts_with("http://")),
                    ),
            )
            // One DeleteObject per chunk: the bulk API is missing from some S3 servers.
            .with_disable_bulk_delete(true)
            .with_retry(RetryConfig {
                max_retries: 3,
                retry_timeout: config.timeout,
                ..RetryConfig::default()
            });
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint);
        }
        if let Some(region) = &config.region {
            builder = builder.with_region(region);
        }
        if let Some(credentials) = &config.credentials {
            builder = builder
                .with_access_key_id(&credentials.access_key_id)
                .with_secret_access_key(&credentials.secret_access_key);
        }
        let store = builder.build().map_err(|e| {
            VolumeError::Config(format!("{location}: configuring the S3 client: {e}"))
        })?;
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 4));
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("terrace-s3")
            .enable_all()
            .build()
            .map_err(|source| VolumeError::Backend {
                what: format!("{location}: starting the S3 runtime"),
                source,
            })?;
        let backend = S3Backend {
            size: AtomicU64::new(config.size),
            created: AtomicU64::new(config.size),
            config,
            counters: Counters::default(),
            store,
            prefix,
            runtime: Some(runtime),
            stripes: (0..STRIPES).map(|_| Stripe::default()).collect(),
        };
        backend.check_metadata()?;
        tracing::debug!(backend = %backend.describe(), "s3 backend opened");
        Ok(backend)
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &S3Config {
        &self.config
    }

    /// The requests sent so far (tests, logs).
    pub fn requests(&self) -> S3Requests {
        let c = &self.counters;
        S3Requests {
            gets: c.gets.load(Ordering::Relaxed),
            puts: c.puts.load(Ordering::Relaxed),
            deletes: c.deletes.load(Ordering::Relaxed),
            merged_rounds: c.merged_rounds.load(Ordering::Relaxed),
        }
    }

    /// The indices of the chunk objects that exist (one LIST; tests and tools).
    pub fn stored_chunks(&self) -> io::Result<Vec<u64>> {
        let mut chunks: Vec<u64> = self
            .objects_under(&self.prefix)?
            .iter()
            .filter_map(|key| key.filename())
            .filter(|name| name.len() == 16)
            .filter_map(|name| u64::from_str_radix(name, 16).ok())
            .collect();
        chunks.sort_unstable();
        Ok(chunks)
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime.as_ref().expect("the runtime lives until drop")
    }

    /// Runs `future` to completion on the private runtime, from this thread — or from a
    /// helper thread when this one is inside a tokio runtime (where `block_on` panics).
    fn block_on<F>(&self, future: F) -> F::Output
    where
        F: Future + Send,
        F::Output: Send,
    {
        if tokio::runtime::Handle::try_current().is_err() {
            return self.runtime().block_on(future);
        }
        std::thread::scope(|s| {
            s.spawn(|| self.runtime().block_on(future))
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })
    }

    /// `request` with the configured timeout, its error naming `op` and `key`; a missing
    /// object is `ErrorKind::NotFound`.
    async fn timed<T, F>(&self, op: &str, key: &Path, request: F) -> io::Result<T>
    where
        F: Future<Output = object_store::Result<T>>,
    {
        match tokio::time::timeout(self.config.timeout, request).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(self.map_error(op, key, error)),
            Err(_) => Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "s3 {op} {}: no answer within {:?}",
                    self.key_uri(key),
                    self.config.timeout
                ),
            )),
        }
    }

    /// [`S3Backend::timed`], counted in `counter`.
    async fn count<T, F>(
        &self,
        counter: &AtomicU64,
        request: F,
        op: &str,
        key: &Path,
    ) -> io::Result<T>
    where
        F: Future<Output = object_store::Result<T>>,
    {
        counter.fetch_add(1, Ordering::Relaxed);
        self.timed(op, key, request).await
    }

    fn map_error(&self, op: &str, key: &Path, error: object_store::Error) -> io::Error {
        let kind = match &error {
            // A missing bucket is a 404 too: an error, never a chunk of zeroes.
            object_store::Error::NotFound { .. } if !error.to_string().contains("NoSuchBucket") => {
                io::ErrorKind::NotFound
            }
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => io::ErrorKind::PermissionDenied,
            _ => io::ErrorKind::Other,
        };
        io::Error::new(kind, format!("s3 {op} {}: {error}", self.key_uri(key)))
    }

    fn key_uri(&self, key: &Path) -> String {
        format!("s3://{}/{key}", self.config.bucket)
    }

    fn chunk_key(&self, chunk: u64) -> Path {
        self.prefix.clone().join(format!("{chunk:016x}"))
    }

    fn chunk_len(&self, chunk: u64) -> usize {
        let start = chunk * self.config.chunk_size;
        (self.size() - start).min(self.config.chunk_size) as usize
    }

    fn stripe(&self, chunk: u64) -> &Stripe {
        // Neighbouring chunks go to different stripes.
        &self.stripes[(chunk % STRIPES as u64) as usize]
    }

    fn check_range(&self, offset: u64, len: u64) -> io::Result<()> {
        crate::backend::check_range(offset, len, self.size(), || {
            format!("s3 volume {}", self.config.location())
        })
    }

    /// The pieces of `[offset, offset + len)`: (chunk, offset in it, length), in order.
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, usize, usize)> + '_ {
        let chunk_size = self.config.chunk_size;
        let end = offset + len;
        let first = offset / chunk_size;
        let last = if len == 0 {
            first
        } else {
            (end - 1) / chunk_size + 1
        };
        (first..last).map(move |chunk| {
            let start = (chunk * chunk_size).max(offset);
            let stop = ((chunk + 1) * chunk_size).min(end);
            (
                chunk,
                (start - chunk * chunk_size) as usize,
                (stop - start) as usize,
            )
        })
    }

    fn check_metadata(&self) -> Result<(), VolumeError> {
        let key = self.prefix.clone().join(METADATA);
        let location = self.config.location();
        let wanted = format!(
            "{METADATA_MAGIC}\nsize {}\nchunk {}\n",
            self.config.size, self.config.chunk_size
        );
        let backend_error = |source| VolumeError::Backend {
            what: format!("opening {location}"),
            source,
        };
        let found = self.block_on(async {
            match self.timed("GET", &key, self.store.get(&key)).await {
                Ok(got) => self.timed("GET", &key, got.bytes()).await.map(Some),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(e),
            }
        });
        match found.map_err(backend_error)? {
            None => {
                let payload = PutPayload::from(wanted.into_bytes());
                self.block_on(self.timed("PUT", &key, self.store.put(&key, payload)))
                    .map_err(backend_error)?;
                tracing::info!(volume = %location, size = self.config.size, "s3 volume created");
                Ok(())
            }
            Some(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                let mut lines = text.lines();
                let mut size = None;
                let mut chunk = None;
                let mut created = None;
                let magic = lines.next() == Some(METADATA_MAGIC);
                for line in lines {
                    match line.split_once(' ') {
                        Some(("size", v)) => size = v.parse::<u64>().ok(),
                        Some(("chunk", v)) => chunk = v.parse::<u64>().ok(),
                        Some(("created", v)) => created = v.parse::<u64>().ok(),
                        _ => {}
                    }
                }
                let (Some(size), Some(chunk), true) = (size, chunk, magic) else {
                    return Err(VolumeError::Config(format!(
                        "{location}: {} is not a Terrace S3 volume's metadata object \
                         (refusing to use the prefix)",
                        self.key_uri(&key)
                    )));
                };
                let created = created.unwrap_or(size);
                let known_size = self.config.size == size || self.config.size == created;
                if !known_size || chunk != self.config.chunk_size {
                    return Err(VolumeError::Config(format!(
                        "{location}: the volume there is {size} bytes in chunks of {chunk} \
                         bytes ({}), not the {} bytes in chunks of {} configured: refusing \
                         to reuse it with another layout",
                        self.key_uri(&key),
                        self.config.size,
                        self.config.chunk_size
                    )));
                }
                self.size.store(size, Ordering::Release);
                self.created.store(created, Ordering::Release);
                Ok(())
            }
        }
    }

    /// Reads one piece of a chunk: zeroes when the chunk does not exist.
    async fn read_piece(&self, chunk: u64, start: usize, dest: &mut [u8]) -> io::Result<()> {
        let key = self.chunk_key(chunk);
        let range = start as u64..(start + dest.len()) as u64;
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        match self
            .timed("GET", &key, self.store.get_range(&key, range))
            .await
        {
            Ok(bytes) if bytes.len() == dest.len() => {
                dest.copy_from_slice(&bytes);
                Ok(())
            }
            Ok(bytes) => Err(self.wrong_length(&key, bytes.len(), dest.len())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                dest.fill(0);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    fn wrong_length(&self, key: &Path, got: usize, wanted: usize) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "s3 GET {}: {got} bytes where {wanted} were expected (not a chunk of this \
                 volume?)",
                self.key_uri(key)
            ),
        )
    }

    /// A leader's round on one chunk: applies `updates` in order to the chunk (read
    /// first unless an update covers all of it) and stores the result: a PUT, or a
    /// DELETE when it is all zeroes.
    async fn apply_round(&self, chunk: u64, updates: Vec<Update>) -> io::Result<()> {
        if updates.len() > 1 {
            self.counters.merged_rounds.fetch_add(1, Ordering::Relaxed);
        }
        let key = self.chunk_key(chunk);
        let len = self.chunk_len(chunk);
        let whole = updates.iter().rposition(|u| u.start == 0 && u.len() == len);
        let (mut content, mut may_exist, rest) = match whole {
            Some(i) => {
                let mut updates = updates;
                let rest = updates.split_off(i + 1);
                let content = match updates.pop().map(|u| u.content) {
                    Some(Content::Bytes(data)) => data,
                    _ => vec![0; len],
                };
                (content, true, rest)
            }
            None => match self
                .count(&self.counters.gets, self.store.get(&key), "GET", &key)
                .await
            {
                Ok(got) => {
                    let bytes = self.timed("GET", &key, got.bytes()).await?;
                    if bytes.len() != len {
                        return Err(self.wrong_length(&key, bytes.len(), len));
                    }
                    (bytes.to_vec(), true, updates)
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => (vec![0; len], false, updates),
                Err(e) => return Err(e),
            },
        };
        for update in rest {
            let range = update.start..update.start + update.len();
            match update.content {
                Content::Bytes(data) => content[range].copy_from_slice(&data),
                Content::Zeroes(_) => content[range].fill(0),
            }
        }
        if is_zero(&content) {
            // After a whole-chunk update the object may exist whatever the GET would say.
            may_exist |= whole.is_some();
            if may_exist {
                self.count(
                    &self.counters.deletes,
                    self.store.delete(&key),
                    "DELETE",
                    &key,
                )
                .await?;
            }
            return Ok(());
        }
        let payload = PutPayload::from(content);
        self.count(
            &self.counters.puts,
            self.store.put(&key, payload),
            "PUT",
            &key,
        )
        .await
        .map(|_| ())
    }

    /// Writes `data` (or zeroes, when `None`) over `[offset, offset + len)`: each chunk's
    /// piece goes through the chunk's queue; returns once every round holding one of
    /// them is done.
    fn update(&self, offset: u64, len: u64, data: Option<&[u8]>) -> io::Result<()> {
        self.check_range(offset, len)?;
        let pieces: Vec<_> = self.pieces(offset, len).collect();
        let mut result = Ok(());
        let mut done = 0usize;
        for window in pieces.chunks(PARALLEL_CHUNKS) {
            let mut tickets: Vec<Ticket> = window
                .iter()
                .map(|&(chunk, start, len)| {
                    let content = match data {
                        Some(data) => Content::Bytes(data[done..done + len].to_vec()),
                        None => Content::Zeroes(len),
                    };
                    done += len;
                    self.enqueue(chunk, Update { start, content })
                })
                .collect();
            self.complete(&mut tickets);
            for ticket in tickets {
                if let Some(Err(e)) = ticket.outcome {
                    if result.is_ok() {
                        result = Err(e.to_io());
                    }
                }
            }
            if result.is_err() {
                break;
            }
        }
        result
    }

    fn enqueue(&self, chunk: u64, update: Update) -> Ticket {
        let stripe = self.stripe(chunk);
        let mut chunks = stripe.chunks.lock();
        let queue = chunks.entry(chunk).or_insert_with(|| ChunkQueue {
            busy: false,
            queued: Vec::new(),
            round: Arc::default(),
            users: 0,
        });
        queue.queued.push(update);
        queue.users += 1;
        Ticket {
            chunk,
            round: Arc::clone(&queue.round),
            outcome: None,
        }
    }

    /// Until every ticket has its outcome: leads the rounds of every ticket whose chunk
    /// is free (all at once), else waits for one of the others.
    fn complete(&self, tickets: &mut [Ticket]) {
        loop {
            let mut leading: Vec<(u64, Vec<Update>, Arc<Round>)> = Vec::new();
            let mut waiting: Option<usize> = None;
            for (i, ticket) in tickets.iter_mut().enumerate() {
                if ticket.outcome.is_some() {
                    continue;
                }
                let stripe = self.stripe(ticket.chunk);
                let mut chunks = stripe.chunks.lock();
                let queue = chunks
                    .get_mut(&ticket.chunk)
                    .expect("a chunk's queue lives while a ticket is pending");
                if let Some(outcome) = ticket.round.outcome.get() {
                    ticket.outcome = Some(outcome.clone());
                    queue.users -= 1;
                    if queue.users == 0 {
                        chunks.remove(&ticket.chunk);
                    }
                } else if !queue.busy && Arc::ptr_eq(&queue.round, &ticket.round) {
                    queue.busy = true;
                    let updates = std::mem::take(&mut queue.queued);
                    let round = std::mem::take(&mut queue.round);
                    leading.push((ticket.chunk, updates, round));
                } else if waiting.is_none() {
                    waiting = Some(i);
                }
            }
            if !leading.is_empty() {
                let rounds = leading
                    .into_iter()
                    .map(|(chunk, updates, round)| async move {
                        let result = self.apply_round(chunk, updates).await;
                        (chunk, round, result)
                    });
                for (chunk, round, result) in self.block_on(futures_util::future::join_all(rounds))
                {
                    let stripe = self.stripe(chunk);
                    let mut chunks = stripe.chunks.lock();
                    let outcome = result.map_err(|e| SharedError {
                        kind: e.kind(),
                        message: e.to_string(),
                    });
                    let _ = round.outcome.set(outcome);
                    if let Some(queue) = chunks.get_mut(&chunk) {
                        queue.busy = false;
                    }
                    stripe.changed.notify_all();
                }
                continue;
            }
            let Some(i) = waiting else { return };
            let ticket = &tickets[i];
            let stripe = self.stripe(ticket.chunk);
            let mut chunks = stripe.chunks.lock();
            loop {
                if ticket.round.outcome.get().is_some() {
                    break;
                }
                let queue = &chunks[&ticket.chunk];
                if !queue.busy && Arc::ptr_eq(&queue.round, &ticket.round) {
                    break;
                }
                stripe.changed.wait(&mut chunks);
            }
        }
    }
}

impl Drop for S3Backend {
    fn drop(&mut self) {
        // Without waiting for the workers: dropping a runtime may not block inside
        // another runtime, and nothing is left in flight (every call has returned).
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl S3Backend {
    /// The metadata object's text for a volume of `size` bytes.
    fn metadata_text(&self, size: u64) -> String {
        let created = self.created.load(Ordering::Acquire);
        let mut text = format!(
            "{METADATA_MAGIC}\nsize {size}\nchunk {}\n",
            self.config.chunk_size
        );
        if created != size {
            text.push_str(&format!("created {created}\n"));
        }
        text
    }

    /// Every object directly under `prefix` (the bucket's top when it is empty; one
    /// LIST).
    fn objects_under(&self, prefix: &Path) -> io::Result<Vec<Path>> {
        let under = (!prefix.as_ref().is_empty()).then_some(prefix);
        let listing =
            self.block_on(self.timed("LIST", prefix, self.store.list_with_delimiter(under)))?;
        Ok(listing.objects.into_iter().map(|o| o.location).collect())
    }

    /// Runs `ops` on the runtime, [`PARALLEL_CHUNKS`] at a time; the first error.
    fn run_all<F>(&self, ops: Vec<F>) -> io::Result<()>
    where
        F: Future<Output = io::Result<()>> + Send,
    {
        let mut ops = ops.into_iter().peekable();
        while ops.peek().is_some() {
            let window: Vec<F> = ops.by_ref().take(PARALLEL_CHUNKS).collect();
            self.block_on(futures_util::future::join_all(window))
                .into_iter()
                .collect::<io::Result<Vec<()>>>()?;
        }
        Ok(())
    }
}

impl Backend for S3Backend {
    fn size(&self) -> u64 {
        self.size.load(Ordering::Acquire)
    }

    /// One PUT of the metadata object with the new size (atomic: S3 replaces whole
    /// objects). The chunks past the old end do not exist yet, so they read as zeroes.
    /// Only from a size that is a whole number of chunks: the old last chunk would
    /// otherwise be a short object where a whole one is now expected.
    fn grow(&self, new_size: u64) -> io::Result<()> {
        let size = self.size();
        if !size.is_multiple_of(self.config.chunk_size) || new_size <= size {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "s3 volume {}: grows only from a whole number of {}-byte chunks to more                      ({size} to {new_size} bytes)",
                    self.config.location(),
                    self.config.chunk_size
                ),
            ));
        }
        let key = self.prefix.clone().join(METADATA);
        let payload = PutPayload::from(self.metadata_text(new_size).into_bytes());
        self.block_on(self.timed("PUT", &key, self.store.put(&key, payload)))?;
        self.size.store(new_size, Ordering::Release);
        Ok(())
    }

    /// Server-side copies of the chunk objects to `PREFIX.snap-TAG/`, the `volume`
    /// object last (see the module docs); an unfinished earlier attempt there is cleared
    /// first, a finished one refused.
    fn snapshot(&self, tag: &str) -> io::Result<String> {
        let target = if self.config.prefix.is_empty() {
            format!("snap-{tag}")
        } else {
            format!("{}.snap-{tag}", self.config.prefix)
        };
        let target = Path::parse(target)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let target_metadata = target.clone().join(METADATA);
        let leftovers = self.objects_under(&target)?;
        if leftovers.contains(&target_metadata) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists", self.key_uri(&target)),
            ));
        }
        self.run_all(
            leftovers
                .iter()
                .map(|key| async move {
                    let deleted = self.timed("DELETE", key, self.store.delete(key)).await;
                    match deleted {
                        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                        _ => Ok(()),
                    }
                })
                .collect(),
        )?;
        let metadata = self.prefix.clone().join(METADATA);
        let chunks: Vec<Path> = self
            .objects_under(&self.prefix)?
            .into_iter()
            .filter(|key| *key != metadata)
            .collect();
        let copy = |from: Path| {
            let to = target.clone().join(from.filename().unwrap_or_default());
            async move { self.timed("COPY", &from, self.store.copy(&from, &to)).await }
        };
        self.run_all(chunks.into_iter().map(copy).collect())?;
        self.run_all(vec![copy(metadata)])?;
        Ok(self.key_uri(&target))
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let pieces: Vec<_> = self.pieces(offset, buf.len() as u64).collect();
        let mut rest = buf;
        for window in pieces.chunks(PARALLEL_CHUNKS) {
            let mut reads = Vec::with_capacity(window.len());
            for &(chunk, start, len) in window {
                let (dest, tail) = std::mem::take(&mut rest).split_at_mut(len);
                rest = tail;
                reads.push(self.read_piece(chunk, start, dest));
            }
            self.block_on(futures_util::future::join_all(reads))
                .into_iter()
                .collect::<io::Result<Vec<()>>>()?;
        }
        Ok(())
    }

    fn write_at(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        self.update(offset, data.len() as u64, Some(data))
    }

    /// Nothing to do: every acknowledged write is a completed PUT (see the module docs).
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64) -> io::Result<()> {
        self.update(offset, len, None)
    }

    fn describe(&self) -> String {
        let endpoint = self.config.endpoint.as_deref().unwrap_or("AWS");
        format!(
            "s3 {} at {endpoint} ({} chunks of {} KiB)",
            self.config.location(),
            self.size().div_ceil(self.config.chunk_size),
            self.config.chunk_size >> 10
        )
    }
}

fn is_zero(data: &[u8]) -> bool {
    let (words, tail) = data.split_at(data.len() - data.len() % 8);
    words
        .chunks_exact(8)
        .all(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")) == 0)
        && tail.iter().all(|&b| b == 0)
}

/// `30s`, `500ms`, `2m`, or a bare number of seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?}: expected a duration such as 30s or 500ms"))?;
    match unit {
        "ms" => Ok(Duration::from_millis(n)),
        "" | "s" => Ok(Duration::from_secs(n)),
        "m" | "min" => Ok(Duration::from_secs(n.saturating_mul(60))),
        other => Err(format!("{s:?}: unknown unit {other:?} (ms, s, m)")),
    }
}

/// Decodes `%XX` escapes (an endpoint may be given as `http%3A%2F%2Fhost%3A9000`).
fn percent_decode(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("{s:?}: a bad %-escape"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?}: not UTF-8 once decoded"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_with_defaults_and_settings() {
        let c = S3Config::from_uri("s3://b/vols/one?size=1GiB").unwrap();
        assert_eq!((c.bucket.as_str(), c.prefix.as_str()), ("b", "vols/one"));
        assert_eq!((c.size, c.chunk_size), (1 << 30, DEFAULT_CHUNK_SIZE));
        assert_eq!(
            (c.endpoint, c.region, c.timeout),
            (None, None, DEFAULT_TIMEOUT)
        );
        let c = S3Config::from_uri(
            "s3://b/p/?endpoint=http%3A%2F%2F127.0.0.1:9000&region=eu-west-1&chunk=4MiB\
             &size=64MiB&timeout=500ms",
        )
        .unwrap();
        assert_eq!(c.prefix, "p");
        assert_eq!(c.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(c.region.as_deref(), Some("eu-west-1"));
        assert_eq!((c.size, c.chunk_size), (64 << 20, 4 << 20));
        assert_eq!(c.timeout, Duration::from_millis(500));
        assert_eq!(S3Config::from_uri("s3://b?size=4KiB").unwrap().prefix, "");
    }

    #[test]
    fn bad_uris_say_what_is_wrong() {
        let err = |uri: &str| S3Config::from_uri(uri).unwrap_err();
        assert!(
            err("s3://b/p").contains("needs its size"),
            "{}",
            err("s3://b/p")
        );
        assert!(err("s3:///p?size=1GiB").contains("no bucket"));
        assert!(err("s3://b/p?size=1GiB&colour=red").contains("unknown setting"));
        assert!(err("s3://b/p?size=1000").contains("multiple of 4096"));
        assert!(err("s3://b/p?size=1GiB&chunk=1000").contains("chunk size"));
        assert!(err("s3://b/p?size=1GiB&chunk=128MiB").contains("chunk size"));
        assert!(err("s3://b/p?size=1GiB&endpoint=ftp://x").contains("endpoint"));
        assert!(err("s3://b/p?size=1GiB&timeout=0s").contains("timeout"));
        assert!(err("s3://b/p?size=1GiB&timeout=3h").contains("unit"));
    }

    #[test]
    fn credentials_debug_hides_the_secret() {
        let c = S3Credentials {
            access_key_id: "AKID".into(),
            secret_access_key: "hunter2".into(),
        };
        assert!(!format!("{c:?}").contains("hunter2"));
    }

    #[test]
    fn zero_check_sees_every_byte() {
        let mut data = vec![0u8; 4099];
        assert!(is_zero(&data));
        for i in [0, 7, 8, 4095, 4098] {
            data[i] = 1;
            assert!(!is_zero(&data), "{i}");
            data[i] = 0;
        }
    }
}
