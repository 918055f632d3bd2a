//! Named roots: the pool's object directory (PCJ's `ObjectDirectory`), name → collection
//! (map or array) or object. It is itself an ordered map whose header the pool's
//! directory word names (`Pool::create_directory`); its values are `kind: u64,
//! offset: u64`.
//!
//! Owns [`Collections`], the entry point to a pool's collections: one per pool per
//! process (it holds the directory map open).
//!
//! Invariants: a name is bound at most once; a map or array is created and bound in the
//! same pool transaction, so after a crash it is bound or does not exist; binding an
//! object never replaces a binding. Lock order: `bind`, then the directory map's writer,
//! then any other map's (or an array's) writer, then a pool lane.

use parking_lot::Mutex;
use terrace_pool::{Backend, Oid, Pool};

use crate::array::{create_array, PersistentArray};
use crate::error::{CollectionError, Result};
use crate::hash::{create_hash_header, hash_geometry, HashMap};
use crate::layout::{Geometry, HEADER_SIZE, TYPE_MAP};
use crate::ordered::{create_header, header_bytes, read_header, OrderedMap};

/// Longest name a binding may have, in bytes.
pub const MAX_NAME: usize = 64;

/// The directory map's geometry: names up to 64 bytes, 16-byte values.
pub(crate) fn directory_geometry() -> Geometry {
    Geometry::new(MAX_NAME as u32, 16)
}

/// What a name is bound to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An [`OrderedMap`]; the offset is its header.
    OrderedMap,
    /// A [`HashMap`]; the offset is its header.
    HashMap,
    /// A program's own object (traced as reachable, its contents are not interpreted).
    Object,
    /// A [`PersistentArray`]; the offset is its object.
    Array,
}

impl Kind {
    pub(crate) fn code(self) -> u64 {
        match self {
            Kind::OrderedMap => 1,
            Kind::HashMap => 2,
            Kind::Object => 3,
            Kind::Array => 4,
        }
    }

    pub(crate) fn from_code(code: u64) -> Option<Kind> {
        match code {
            1 => Some(Kind::OrderedMap),
            2 => Some(Kind::HashMap),
            3 => Some(Kind::Object),
            4 => Some(Kind::Array),
            _ => None,
        }
    }

    /// The kind's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Kind::OrderedMap => "ordered map",
            Kind::HashMap => "hash map",
            Kind::Object => "object",
            Kind::Array => "array",
        }
    }
}

/// One directory entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binding {
    pub name: String,
    pub kind: Kind,
    pub oid: Oid,
}

/// Decodes a directory value; `at` names the entry in errors.
pub(crate) fn decode_binding(name: &[u8], value: &[u8], at: u64) -> Result<Binding> {
    let bad = |what: String| CollectionError::corrupt(at, what);
    let name = std::str::from_utf8(name)
        .map_err(|_| bad("a directory name is not UTF-8".into()))?
        .to_owned();
    if value.len() != 16 {
        return Err(bad(format!("{name:?} has a {}-byte binding", value.len())));
    }
    let code = u64::from_le_bytes(value[..8].try_into().expect("8 bytes"));
    let off = u64::from_le_bytes(value[8..].try_into().expect("8 bytes"));
    let kind = Kind::from_code(code).ok_or_else(|| bad(format!("{name:?} has kind {code}")))?;
    let oid = Oid::from_offset(off).ok_or_else(|| bad(format!("{name:?} is bound to offset 0")))?;
    Ok(Binding { name, kind, oid })
}

fn encode_binding(kind: Kind, oid: Oid) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..8].copy_from_slice(&kind.code().to_le_bytes());
    v[8..].copy_from_slice(&oid.offset().to_le_bytes());
    v
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME {
        return Err(CollectionError::InvalidArgument {
            what: "name",
            detail: format!("{} bytes; names are 1..={MAX_NAME} bytes", name.len()),
        });
    }
    Ok(())
}

/// Refuses sizes other than an existing map's (0 accepts them).
fn check_sizes(opts: &MapOptions, g: &Geometry) -> Result<()> {
    if opts.max_key != 0 && opts.max_key != g.key_cap {
        return Err(CollectionError::Mismatch {
            what: "max key",
            found: g.key_cap,
            asked: opts.max_key,
        });
    }
    if opts.inline_value != 0 && opts.inline_value.max(8) != g.val_area {
        return Err(CollectionError::Mismatch {
            what: "inline value",
            found: g.val_area,
            asked: opts.inline_value,
        });
    }
    Ok(())
}

/// How [`Collections::ordered_map`] and [`Collections::hash_map`] open a map.
#[derive(Clone, Copy, Debug)]
pub struct MapOptions {
    /// Longest key (1..=255 bytes); 0 accepts what an existing map was created with.
    pub max_key: u32,
    /// Values up to this many bytes (0..=254) are kept in the entry, longer ones in an
    /// object of their own; 0 accepts an existing map's. Raised to 8.
    pub inline_value: u32,
    /// Create the map when the name is unbound.
    pub create: bool,
    /// Slots per leaf or bucket page, and children per inner node or buckets per hash
    /// segment (tests use small ones for deep trees and many splits); `None`: 64 slots,
    /// about 4 KiB inner nodes, 512-bucket segments.
    pub shape: Option<(u32, u32)>,
}

impl MapOptions {
    /// Open or create a map for keys up to `max_key` bytes, values inline up to
    /// `inline_value` bytes.
    pub fn create(max_key: u32, inline_value: u32) -> MapOptions {
        MapOptions {
            max_key,
            inline_value,
            create: true,
            shape: None,
        }
    }

    /// Open an existing map with whatever sizes it has.
    pub fn existing() -> MapOptions {
        MapOptions {
            max_key: 0,
            inline_value: 0,
            create: false,
            shape: None,
        }
    }

    fn geometry(&self, kind: Kind) -> Result<Geometry> {
        if self.max_key == 0 || self.max_key > 255 || self.inline_value > 254 {
            return Err(CollectionError::InvalidArgument {
                what: "map sizes",
                detail: format!(
                    "max key {} (1..=255), inline value {} (0..=254)",
                    self.max_key, self.inline_value
                ),
            });
        }
        let mut g = match kind {
            Kind::HashMap => hash_geometry(self.max_key, self.inline_value),
            _ => Geometry::new(self.max_key, self.inline_value),
        };
        if let Some((slots, fanout)) = self.shape {
            g.leaf_slots = slots;
            g.fanout = fanout;
        }
        g.validate()
            .map_err(|detail| CollectionError::InvalidArgument {
                what: "map shape",
                detail,
            })?;
        Ok(g)
    }
}

/// How [`Collections::array`] opens an array.
#[derive(Clone, Copy, Debug)]
pub struct ArrayOptions {
    /// Elements (at least 1); 0 accepts an existing array's.
    pub length: u64,
    /// Bytes per element (1..=4096); 0 accepts an existing array's.
    pub element_size: u32,
    /// Create the array (zeroed) when the name is unbound.
    pub create: bool,
}

impl ArrayOptions {
    /// Open or create an array of `length` elements of `element_size` bytes.
    pub fn create(length: u64, element_size: u32) -> ArrayOptions {
        ArrayOptions {
            length,
            element_size,
            create: true,
        }
    }

    /// Open an existing array with whatever sizes it has.
    pub fn existing() -> ArrayOptions {
        ArrayOptions {
            length: 0,
            element_size: 0,
            create: false,
        }
    }
}

/// A pool's collections and named roots. See the module docs.
pub struct Collections<'p, B: Backend> {
    pool: &'p Pool<B>,
    dir: OrderedMap<'p, B>,
    bind: Mutex<()>,
}

impl<'p, B: Backend> Collections<'p, B> {
    /// Opens the pool's directory, creating it (crash-atomically) on first use. `Busy`
    /// when this process already has it open.
    pub fn open(pool: &'p Pool<B>) -> Result<Self> {
        let header = match pool.directory()? {
            Some(oid) => oid,
            None => {
                let bytes = header_bytes(&directory_geometry());
                pool.create_directory(HEADER_SIZE, TYPE_MAP, |w| w.write(0, &bytes))?
            }
        };
        if read_header(pool, header.offset())? != directory_geometry() {
            return Err(CollectionError::corrupt(
                header.offset(),
                "the directory map has another geometry",
            ));
        }
        Ok(Collections {
            pool,
            dir: OrderedMap::attach(pool, header.offset())?,
            bind: Mutex::new(()),
        })
    }

    /// [`Collections::open`] after the opt-in sweep: [`crate::check()`] the pool, free
    /// the collection objects no name reaches ([`crate::sweep`]) and return how many.
    /// Run it where no other handle of the pool's collections is open.
    pub fn open_sweeping(pool: &'p Pool<B>) -> Result<(Self, u64)> {
        let report = crate::check(pool)?;
        let freed = crate::sweep(pool, &report)?;
        Ok((Collections::open(pool)?, freed))
    }

    /// The pool.
    pub fn pool(&self) -> &'p Pool<B> {
        self.pool
    }

    /// What `name` is bound to.
    pub fn lookup(&self, name: &str) -> Result<Option<Binding>> {
        check_name(name)?;
        match self.dir.get(name.as_bytes())? {
            None => Ok(None),
            Some(v) => decode_binding(name.as_bytes(), &v, self.dir.header().offset()).map(Some),
        }
    }

    /// Every binding, by name.
    pub fn bindings(&self) -> Result<Vec<Binding>> {
        let at = self.dir.header().offset();
        self.dir
            .iter()
            .map(|e| e.and_then(|(k, v)| decode_binding(&k, &v, at)))
            .collect()
    }

    /// Binds `name` to a live object of the program's (not a collection's); crash-atomic.
    pub fn bind_object(&self, name: &str, oid: Oid) -> Result<()> {
        check_name(name)?;
        let type_num = self.pool.type_of(oid)?;
        if crate::layout::is_collection_type(type_num) {
            return Err(CollectionError::InvalidArgument {
                what: "object",
                detail: format!("{:#x} is a collection's node", oid.offset()),
            });
        }
        let _b = self.bind.lock();
        if self.dir.contains(name.as_bytes())? {
            return Err(CollectionError::AlreadyBound { name: name.into() });
        }
        self.dir
            .put(name.as_bytes(), &encode_binding(Kind::Object, oid))?;
        Ok(())
    }

    /// Removes the binding of an object (not a map: see [`Collections::destroy`]) and
    /// returns the object, which the program now owns again.
    pub fn unbind_object(&self, name: &str) -> Result<Oid> {
        let _b = self.bind.lock();
        let b = self
            .lookup(name)?
            .ok_or_else(|| CollectionError::NotFound { name: name.into() })?;
        if b.kind != Kind::Object {
            return Err(CollectionError::WrongKind {
                name: name.into(),
                found: b.kind.name(),
                expected: Kind::Object.name(),
            });
        }
        self.dir.remove(name.as_bytes())?;
        Ok(b.oid)
    }

    /// Opens the ordered map bound to `name`, creating and binding it in one transaction
    /// when it is unbound and `opts.create`.
    pub fn ordered_map(&self, name: &str, opts: MapOptions) -> Result<OrderedMap<'p, B>> {
        let (header, created) = self.open_or_create(name, Kind::OrderedMap, &opts, |tx, geo| {
            create_header(tx, geo)
        })?;
        let map = OrderedMap::attach(self.pool, header)?;
        if !created {
            check_sizes(&opts, &map.geometry())?;
        }
        Ok(map)
    }

    /// Opens the hash map bound to `name`, creating and binding it in one transaction
    /// when it is unbound and `opts.create`. Its `shape` is (page slots, buckets per
    /// segment).
    pub fn hash_map(&self, name: &str, opts: MapOptions) -> Result<HashMap<'p, B>> {
        let (header, created) = self.open_or_create(name, Kind::HashMap, &opts, |tx, geo| {
            create_hash_header(tx, geo)
        })?;
        let map = HashMap::attach(self.pool, header)?;
        if !created {
            check_sizes(&opts, &map.geometry())?;
        }
        Ok(map)
    }

    /// Opens the array bound to `name`, creating it (zeroed) and binding it in one
    /// transaction when it is unbound and `opts.create`; sizes other than 0 must match an
    /// existing array's.
    pub fn array(&self, name: &str, opts: ArrayOptions) -> Result<PersistentArray<'p, B>> {
        let (header, created) = self.bind_new(name, Kind::Array, opts.create, |tx| {
            create_array(tx, self.pool.size(), opts.length, opts.element_size)
        })?;
        let array = PersistentArray::attach(self.pool, header)?;
        if !created {
            let sizes = [
                ("length", array.len(), opts.length),
                (
                    "element size",
                    array.element_size() as u64,
                    opts.element_size as u64,
                ),
            ];
            for (what, found, asked) in sizes {
                if asked != 0 && asked != found {
                    return Err(CollectionError::InvalidArgument {
                        what: "array sizes",
                        detail: format!("the array has {what} {found}, caller asks for {asked}"),
                    });
                }
            }
        }
        Ok(array)
    }

    /// The header `name` binds (of `kind`), or a new one created by `create` and bound
    /// in the same transaction; whether it was created.
    fn open_or_create(
        &self,
        name: &str,
        kind: Kind,
        opts: &MapOptions,
        create: impl FnOnce(&mut terrace_pool::Tx<'p, B>, &Geometry) -> Result<Oid>,
    ) -> Result<(u64, bool)> {
        self.bind_new(name, kind, opts.create, |tx| {
            let geo = opts.geometry(kind)?;
            create(tx, &geo)
        })
    }

    /// The object `name` binds (of `kind`), or a new one made by `create` and bound in
    /// the same transaction when the name is unbound and `create_missing`; whether it was
    /// created.
    fn bind_new(
        &self,
        name: &str,
        kind: Kind,
        create_missing: bool,
        create: impl FnOnce(&mut terrace_pool::Tx<'p, B>) -> Result<Oid>,
    ) -> Result<(u64, bool)> {
        check_name(name)?;
        let _b = self.bind.lock();
        if let Some(b) = self.lookup(name)? {
            if b.kind != kind {
                return Err(CollectionError::WrongKind {
                    name: name.into(),
                    found: b.kind.name(),
                    expected: kind.name(),
                });
            }
            return Ok((b.oid.offset(), false));
        }
        if !create_missing {
            return Err(CollectionError::NotFound { name: name.into() });
        }
        let _w = self.dir.lock();
        let header = self.dir.structural(|tx| {
            let header = create(tx)?;
            self.dir
                .put_tx(tx, name.as_bytes(), &encode_binding(kind, header))?;
            Ok(header)
        })?;
        Ok((header.offset(), true))
    }

    /// Unbinds the map (either kind) or array `name` and frees its nodes and values. The
    /// unbinding is one transaction; the frees follow in batches, so a crash in between
    /// leaves nodes no root reaches, which [`crate::check()`] reports and [`crate::sweep`]
    /// frees. `Busy` while the map is open in this process.
    pub fn destroy(&self, name: &str) -> Result<()> {
        self.destroy_if(name, "map or array", |_| true)
    }

    /// [`Collections::destroy`] when `name` is bound to a collection of `kind`;
    /// `WrongKind` when it is bound to anything else.
    pub fn destroy_kind(&self, name: &str, kind: Kind) -> Result<()> {
        self.destroy_if(name, kind.name(), |k| k == kind)
    }

    /// [`Collections::destroy`] when `name` is bound to a map of either kind; `WrongKind`
    /// when it is bound to anything else (an array included).
    pub fn destroy_map(&self, name: &str) -> Result<()> {
        self.destroy_if(name, "map", |k| {
            matches!(k, Kind::OrderedMap | Kind::HashMap)
        })
    }

    /// Destroys the collection `name` binds if `accept` takes its kind (`expected` names
    /// what it takes, for the error).
    fn destroy_if(
        &self,
        name: &str,
        expected: &'static str,
        accept: impl Fn(Kind) -> bool,
    ) -> Result<()> {
        let _b = self.bind.lock();
        let b = self
            .lookup(name)?
            .ok_or_else(|| CollectionError::NotFound { name: name.into() })?;
        if !accept(b.kind) {
            return Err(CollectionError::WrongKind {
                name: name.into(),
                found: b.kind.name(),
                expected,
            });
        }
        let mut objects = match b.kind {
            Kind::OrderedMap => OrderedMap::attach(self.pool, b.oid.offset())?.objects()?,
            Kind::HashMap => HashMap::attach(self.pool, b.oid.offset())?.objects()?,
            // Opened (and closed) only to refuse an array open in this process.
            Kind::Array => {
                PersistentArray::attach(self.pool, b.oid.offset())?;
                Vec::new()
            }
            Kind::Object => {
                return Err(CollectionError::WrongKind {
                    name: name.into(),
                    found: b.kind.name(),
                    expected,
                })
            }
        };
        objects.push(b.oid.offset());
        self.dir.remove(name.as_bytes())?;
        for batch in objects.chunks(128) {
            let mut tx = self.pool.begin()?;
            for &off in batch {
                tx.free(Oid::from_offset(off).expect("nodes are never at offset 0"))?;
            }
            tx.commit()?;
        }
        Ok(())
    }
}
