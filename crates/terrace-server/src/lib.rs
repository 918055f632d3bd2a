//! terrace-server: `terrace serve`, a memcached-compatible server over the Terrace tiered
//! cache. It speaks memcached's ascii, meta and binary protocols over TCP and UNIX
//! sockets, so every memcached client library, twemproxy/nutcracker and mcrouter reach
//! the tiers unchanged.
//!
//! Layering (arrows point down): `server` (listeners, signals, lifecycle) → `workers`
//! (per-thread event loops, connection hand-off) → `uring` (the io_uring
//! loop, flash reads on its ring) or `conn` (one connection's read/handle/write loop on
//! epoll, and the session state both drive) → `proto` (pure byte-slice parsers and
//! formatters, one module per protocol) → `shared` (memcached semantics over the cache:
//! expiry rules, counted operations) → `terrace-cache`. `config` turns flags and a TOML
//! file into a [`config::ServerConfig`]; `stats` renders memcached's stat names and the
//! Prometheus text format; `marks` keeps the meta protocol's per-item stale and win
//! marks, which the engine does not store.

// Unsafe code is allowed in `uring` alone (the ring reads and writes our buffers).
#![deny(unsafe_code)]

pub mod config;
pub mod conn;
pub mod marks;
pub mod proto;
pub mod server;
pub mod shared;
pub mod stats;
pub mod uring;
pub mod workers;

pub use config::ServerConfig;
pub use server::{run, ServeError};
pub use shared::Shared;
