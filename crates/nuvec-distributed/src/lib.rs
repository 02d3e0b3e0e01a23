//! Collectives over a group of ranks, as MLX's `mx.distributed`: [`Group::all_sum`],
//! [`Group::all_gather`], [`Group::sum_scatter`] (a reduce-scatter), [`Group::all_max`],
//! [`Group::all_min`], [`Group::send`] and [`Group::recv`].
//!
//! A group's ranks are threads of one process ([`Group::local`]: one process driving several
//! devices, and tests) or processes ([`Group::tcp`], what [`init`] builds from the environment
//! that [`launch`] sets). Without a group in the environment, [`init`] gives a group of one
//! rank whose collectives return their input, as MLX's does. A rank that fails or exits ends
//! the group with an error on every other rank, within the group's time-out, never a hang.
//!
//! The collectives run when called: each evaluates its input. Every rank reduces the same
//! values in rank order, so all ranks hold bit-identical results.
//!
//! When the default device (this thread's, [`nuvec_core::device::with_stream`]) is a GPU, the collectives of a group of several ranks go through
//! NCCL ([`nuvec_cuda::nccl`]) once every rank has NCCL and a GPU of its own (checked together
//! on the first collective, so all ranks decide alike); otherwise through the host. The
//! `NUVEC_DIST_BACKEND` variable asks for one: `nccl` (an error when it cannot be used) or
//! `host`. Every rank must pass arrays of the same shape and dtype.
//!
//! ```
//! use nuvec::{Array, distributed::Group};
//! let ranks = Group::local(2);
//! let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
//!     let handles: Vec<_> = ranks
//!         .iter()
//!         .map(|g| s.spawn(move || {
//!             let x = Array::from_slice(&[g.rank() as f32 + 1.0; 3], [3]);
//!             g.all_sum(&x).unwrap().to_vec::<f32>().unwrap()
//!         }))
//!         .collect();
//!     handles.into_iter().map(|h| h.join().unwrap()).collect()
//! });
//! assert_eq!(sums, vec![vec![3.0; 3], vec![3.0; 3]]);
//! ```

mod transport;

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::path::Path;
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::sync::Mutex;

use nuvec_core::{Array, DType, Error, Result, ops};
use nuvec_cuda::nccl::{Nccl, ReduceOp, gpu_uuid, nccl_unavailable_reason, nccl_unique_id};
use transport::{Channels, Tcp, Transport};

/// How long a rank waits for another before the group fails, unless `NUVEC_DIST_TIMEOUT`
/// (seconds) says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);

/// The environment variables [`launch`] sets and [`init`] reads: this process's rank, the
/// number of ranks, and each rank's `host:port`, comma-separated in rank order.
pub const RANK_VAR: &str = "NUVEC_RANK";
/// See [`RANK_VAR`].
pub const SIZE_VAR: &str = "NUVEC_WORLD_SIZE";
/// See [`RANK_VAR`].
pub const HOSTS_VAR: &str = "NUVEC_DIST_HOSTS";

/// A group of ranks that run collectives together. Cheap to clone; each rank holds its own.
#[derive(Clone)]
pub struct Group {
    rank: usize,
    size: usize,
    transport: Option<Arc<dyn Transport>>,
    timeout: Duration,
    /// How GPU arrays travel, decided on the first collective over them: through NCCL
    /// (`Some(Some(_))`) or the host (`Some(None)`).
    gpu: Arc<Mutex<Option<Option<Arc<Nccl>>>>>,
}

impl std::fmt::Debug for Group {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Group {{ rank: {}, size: {} }}", self.rank, self.size)
    }
}

/// The time-out of groups built here: `NUVEC_DIST_TIMEOUT` seconds, else [`DEFAULT_TIMEOUT`].
fn timeout_from_env() -> Result<Duration> {
    match std::env::var("NUVEC_DIST_TIMEOUT") {
        Ok(v) => {
            v.trim().parse::<f64>().ok().filter(|s| *s > 0.0 && s.is_finite()).map(Duration::from_secs_f64).ok_or_else(
                || Error::InvalidArgument(format!("NUVEC_DIST_TIMEOUT={v:?} is not a positive number of seconds")),
            )
        }
        Err(_) => Ok(DEFAULT_TIMEOUT),
    }
}

/// The group this process belongs to: from [`RANK_VAR`], [`SIZE_VAR`] and [`HOSTS_VAR`] (as
/// [`launch`] sets them) a group of processes over TCP; without them, a group of one rank, or
/// with `strict` an error (as `mx.distributed.init(strict=True)`).
pub fn init(strict: bool) -> Result<Group> {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    let (Some(rank), Some(size), Some(hosts)) = (var(RANK_VAR), var(SIZE_VAR), var(HOSTS_VAR)) else {
        if strict {
            return Err(Error::InvalidArgument(format!(
                "distributed::init: no group in the environment ({RANK_VAR}, {SIZE_VAR}, {HOSTS_VAR}); start the ranks with distributed::launch"
            )));
        }
        return Ok(Group::singleton());
    };
    let parse = |name: &str, v: &str| {
        v.trim()
            .parse::<usize>()
            .map_err(|_| Error::InvalidArgument(format!("distributed::init: {name}={v:?} is not a count")))
    };
    let (rank, size) = (parse(RANK_VAR, &rank)?, parse(SIZE_VAR, &size)?);
    let addrs = hosts
        .split(',')
        .map(|h| {
            h.trim().to_socket_addrs().ok().and_then(|mut a| a.next()).ok_or_else(|| {
                Error::InvalidArgument(format!("distributed::init: {HOSTS_VAR} names {h:?}, not a host:port"))
            })
        })
        .collect::<Result<Vec<SocketAddr>>>()?;
    if addrs.len() != size || rank >= size {
        return Err(Error::InvalidArgument(format!(
            "distributed::init: rank {rank} of {size} ranks with {} addresses in {HOSTS_VAR}",
            addrs.len()
        )));
    }
    Group::tcp(rank, &addrs, timeout_from_env()?)
}

impl Group {
    fn new(rank: usize, size: usize, transport: Option<Arc<dyn Transport>>, timeout: Duration) -> Group {
        Group { rank, size, transport, timeout, gpu: Arc::new(Mutex::new(None)) }
    }

    /// A group of one rank: its collectives return their input.
    pub fn singleton() -> Group {
        Group::new(0, 1, None, DEFAULT_TIMEOUT)
    }

    /// `n` ranks in this process (one per thread), in rank order, with [`DEFAULT_TIMEOUT`].
    pub fn local(n: usize) -> Vec<Group> {
        Group::local_with_timeout(n, DEFAULT_TIMEOUT)
    }

    /// [`Group::local`] waiting at most `timeout` for another rank.
    pub fn local_with_timeout(n: usize, timeout: Duration) -> Vec<Group> {
        Channels::group(n, timeout)
            .into_iter()
            .enumerate()
            .map(|(rank, t)| Group::new(rank, n, Some(Arc::new(t) as Arc<dyn Transport>), timeout))
            .collect()
    }

    /// Rank `rank` of a group of processes, rank `i` listening on `addrs[i]` (connections are
    /// made once, between every pair of ranks); fails if they are not all there within
    /// `timeout`, which also bounds every later wait.
    pub fn tcp(rank: usize, addrs: &[SocketAddr], timeout: Duration) -> Result<Group> {
        if rank >= addrs.len() {
            return Err(Error::InvalidArgument(format!("distributed: rank {rank} of {} addresses", addrs.len())));
        }
        let transport = Tcp::connect(rank, addrs, timeout)?;
        Ok(Group::new(rank, addrs.len(), Some(Arc::new(transport)), timeout))
    }

    /// This rank, `0..size()`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Whether this group's collectives over GPU arrays go through NCCL: decided with the other
    /// ranks on the first such collective (see the crate docs); `false` before it.
    pub fn uses_nccl(&self) -> bool {
        matches!(*self.gpu.lock().unwrap_or_else(|e| e.into_inner()), Some(Some(_)))
    }

    /// The NCCL communicator GPU collectives go through, if they do (see the crate docs). All
    /// ranks call it together on their first GPU collective.
    fn nccl(&self) -> Result<Option<Arc<Nccl>>> {
        // This thread's device: one process may drive a GPU per rank (`with_stream`).
        let device = nuvec_core::device::default_stream().device;
        if self.size == 1 || device.is_cpu() {
            return Ok(None);
        }
        let mut slot = self.gpu.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(link) = &*slot {
            return Ok(link.clone());
        }
        let mode = std::env::var("NUVEC_DIST_BACKEND").unwrap_or_default();
        let required = match mode.trim() {
            "" | "auto" => false,
            "nccl" => true,
            "host" => {
                *slot = Some(None);
                return Ok(None);
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "NUVEC_DIST_BACKEND={other:?}: use nccl, host or auto (or unset it)"
                )));
            }
        };
        // Every rank says whether it has NCCL and which GPU it drives; NCCL needs all of them
        // on GPUs of their own.
        let why_not = nccl_unavailable_reason();
        let uuid = if why_not.is_none() { gpu_uuid(device)? } else { [0; 16] };
        let mine: Vec<u8> = std::iter::once(why_not.is_none() as u8).chain(uuid).collect();
        let all: Vec<u8> = self
            .gather("all_gather", &Array::from_slice(&mine, [17]))?
            .iter()
            .map(|a| a.to_vec::<u8>())
            .collect::<Result<Vec<_>>>()?
            .concat();
        let rows: Vec<&[u8]> = all.chunks(17).collect();
        let missing = rows.iter().position(|r| r[0] == 0);
        let shared =
            (0..rows.len()).flat_map(|a| (a + 1..rows.len()).map(move |b| (a, b))).find(|&(a, b)| rows[a] == rows[b]);
        let refusal = match (missing, shared) {
            (Some(r), _) => {
                Some(format!("rank {r} has no NCCL{}", why_not.map(|w| format!(" ({w})")).unwrap_or_default()))
            }
            (None, Some((a, b))) => Some(format!("ranks {a} and {b} share a GPU, which NCCL refuses")),
            (None, None) => None,
        };
        if let Some(why) = refusal {
            if required {
                return Err(Error::Backend(format!("distributed: NUVEC_DIST_BACKEND=nccl, but {why}")));
            }
            *slot = Some(None);
            return Ok(None);
        }
        let t = self.transport()?;
        let id = if self.rank == 0 {
            let id = nccl_unique_id()?;
            for r in 1..self.size {
                t.send(r, &id)?;
            }
            id
        } else {
            let got = t.recv(0)?;
            got.try_into().map_err(|_| Error::Backend("distributed: rank 0 sent a malformed NCCL id".into()))?
        };
        let comm = Arc::new(Nccl::new(device, self.rank, self.size, &id, self.timeout)?);
        *slot = Some(Some(comm.clone()));
        Ok(Some(comm))
    }

    /// The NCCL communicator, when an earlier collective of every rank chose it: point-to-point
    /// transfers take part in no decision, which needs every rank.
    fn nccl_chosen(&self) -> Option<Arc<Nccl>> {
        self.gpu.lock().unwrap_or_else(|e| e.into_inner()).clone().flatten()
    }

    fn transport(&self) -> Result<&dyn Transport> {
        self.transport
            .as_deref()
            .ok_or_else(|| Error::InvalidArgument("distributed: a group of one rank has no peers".into()))
    }

    /// Every rank's `x` (same shape and dtype everywhere), in rank order: a ring of `size - 1`
    /// steps, each sending one rank's bytes on while receiving the next.
    fn gather(&self, op: &str, x: &Array) -> Result<Vec<Array>> {
        let mine = encode(x)?;
        if self.size == 1 {
            return Ok(vec![x.clone()]);
        }
        let t = self.transport()?;
        let n = self.size;
        let (next, prev) = ((self.rank + 1) % n, (self.rank + n - 1) % n);
        let mut parts: Vec<Option<Vec<u8>>> = vec![None; n];
        parts[self.rank] = Some(mine);
        for s in 0..n - 1 {
            let (out, into) = ((self.rank + n - s) % n, (self.rank + 2 * n - s - 1) % n);
            let sending = parts[out].as_deref().unwrap_or_default();
            let got = std::thread::scope(|scope| {
                let sender = scope.spawn(|| t.send(next, sending));
                let got = t.recv(prev);
                let sent =
                    sender.join().unwrap_or_else(|_| Err(Error::Backend("distributed: a sender panicked".into())));
                sent.and(got)
            })?;
            parts[into] = Some(got);
        }
        let (shape, dtype) = (x.shape().to_vec(), x.dtype());
        parts
            .into_iter()
            .enumerate()
            .map(|(r, p)| {
                decode_as(&p.unwrap_or_default(), &shape, dtype, |s, d| {
                    format!(
                        "distributed::{op}: rank {r} gave an array of shape {s:?} and dtype {d}, rank {} one of shape {shape:?} and dtype {dtype}",
                        self.rank
                    )
                })
            })
            .collect()
    }

    /// Every rank's `x` in rank order, reduced by `f`.
    fn reduce(&self, op: &str, x: &Array, f: impl Fn(Array, &Array) -> Array) -> Result<Array> {
        let mut parts = self.gather(op, x)?.into_iter();
        let first = parts.next().ok_or_else(|| Error::Backend(format!("distributed::{op}: no ranks")))?;
        let out = parts.fold(first, |acc, p| f(acc, &p));
        out.eval()?;
        Ok(out)
    }

    /// The sum over ranks of `x`, on every rank (`mx.distributed.all_sum`). Every rank must
    /// pass the same shape and dtype.
    pub fn all_sum(&self, x: &Array) -> Result<Array> {
        if let Some(c) = self.nccl()? {
            return c.all_reduce(x, ReduceOp::Sum);
        }
        self.reduce("all_sum", x, |a, b| a + b)
    }

    /// The element-wise maximum over ranks of `x`, on every rank.
    pub fn all_max(&self, x: &Array) -> Result<Array> {
        if let Some(c) = self.nccl()? {
            return c.all_reduce(x, ReduceOp::Max);
        }
        self.reduce("all_max", x, |a, b| a.maximum(b))
    }

    /// The element-wise minimum over ranks of `x`, on every rank.
    pub fn all_min(&self, x: &Array) -> Result<Array> {
        if let Some(c) = self.nccl()? {
            return c.all_reduce(x, ReduceOp::Min);
        }
        self.reduce("all_min", x, |a, b| a.minimum(b))
    }

    /// Every rank's `x` concatenated along the first axis in rank order (a scalar becomes a
    /// vector of `size()`), on every rank (`mx.distributed.all_gather`).
    pub fn all_gather(&self, x: &Array) -> Result<Array> {
        if let Some(c) = self.nccl()? {
            // NCCL stacks the ranks' arrays: [size, ...] made [size · first, ...].
            let mut shape = x.shape().to_vec();
            match shape.first_mut() {
                Some(first) => *first *= self.size as i32,
                None => shape.push(self.size as i32),
            }
            return Ok(c.all_gather(x)?.reshape(shape));
        }
        let parts = self.gather("all_gather", x)?;
        let parts: Vec<Array> = if x.ndim() == 0 { parts.iter().map(|p| p.reshape([1])).collect() } else { parts };
        let out = ops::concatenate(&parts, 0);
        out.eval()?;
        Ok(out)
    }

    /// The sum over ranks of `x`, scattered: rank `r` gets rows `r·m .. (r + 1)·m` of the first
    /// axis, `m` being its length over `size()` (`mx.distributed.sum_scatter`, a
    /// reduce-scatter). The first axis must divide evenly.
    pub fn sum_scatter(&self, x: &Array) -> Result<Array> {
        let rows = x.shape().first().copied().unwrap_or(0) as usize;
        if x.ndim() == 0 || !rows.is_multiple_of(self.size) {
            return Err(Error::InvalidArgument(format!(
                "distributed::sum_scatter: x's first axis ({:?}) must divide into {} ranks",
                x.shape(),
                self.size
            )));
        }
        if let Some(c) = self.nccl()? {
            return c.reduce_scatter(x);
        }
        let m = (rows / self.size) as i32;
        let r = self.rank as i32;
        let out = self.all_sum(x)?.i(r * m..(r + 1) * m);
        out.eval()?;
        Ok(out)
    }

    /// Sends `x` to rank `dst`, which takes it with [`Group::recv`] or [`Group::recv_like`].
    pub fn send(&self, x: &Array, dst: usize) -> Result<()> {
        self.check_peer("send", dst)?;
        if let Some(c) = self.nccl_chosen() {
            return c.send(x, dst);
        }
        self.transport()?.send(dst, &encode(x)?)
    }

    /// The array rank `src` sent with [`Group::send`], which must have this shape and dtype.
    pub fn recv(&self, shape: &[i32], dtype: DType, src: usize) -> Result<Array> {
        self.check_peer("recv", src)?;
        if let Some(c) = self.nccl_chosen() {
            return c.recv(shape, dtype, src);
        }
        let bytes = self.transport()?.recv(src)?;
        decode_as(&bytes, shape, dtype, |s, d| {
            format!(
                "distributed::recv: rank {src} sent shape {s:?} and dtype {d}, rank {} expected shape {shape:?} and dtype {dtype}",
                self.rank
            )
        })
    }

    /// [`Group::recv`] of `x`'s shape and dtype.
    pub fn recv_like(&self, x: &Array, src: usize) -> Result<Array> {
        self.recv(x.shape(), x.dtype(), src)
    }

    fn check_peer(&self, op: &str, peer: usize) -> Result<()> {
        if peer >= self.size || peer == self.rank {
            return Err(Error::InvalidArgument(format!(
                "distributed::{op}: rank {peer} is not another rank of this group (rank {} of {})",
                self.rank, self.size
            )));
        }
        Ok(())
    }
}

/// `x` as a message: its dtype (index in [`DType::ALL`]), rank, shape and row-major bytes.
fn encode(x: &Array) -> Result<Vec<u8>> {
    let bytes = x.to_bytes()?;
    let code = DType::ALL.iter().position(|&d| d == x.dtype()).unwrap_or(0) as u8;
    let mut out = Vec::with_capacity(bytes.len() + 8 + 4 * x.ndim());
    out.push(code);
    out.extend((x.ndim() as u32).to_le_bytes());
    for &d in x.shape() {
        out.extend(d.to_le_bytes());
    }
    out.extend(bytes);
    Ok(out)
}

/// The shape, dtype and bytes of a message [`encode`] made.
fn decode(m: &[u8]) -> Result<(Vec<i32>, DType, &[u8])> {
    let bad = || Error::Backend("distributed: a malformed message".into());
    let (&code, rest) = m.split_first().ok_or_else(bad)?;
    let dtype = *DType::ALL.get(code as usize).ok_or_else(bad)?;
    let (nd, rest) = rest.split_at_checked(4).ok_or_else(bad)?;
    let nd = u32::from_le_bytes(nd.try_into().map_err(|_| bad())?) as usize;
    let (dims, data) = rest.split_at_checked(4 * nd).ok_or_else(bad)?;
    let shape = dims.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok((shape, dtype, data))
}

/// The array of a message [`encode`] made, which must have `shape` and `dtype`; otherwise the
/// error `mismatch` words from the message's shape and dtype.
fn decode_as(m: &[u8], shape: &[i32], dtype: DType, mismatch: impl FnOnce(&[i32], DType) -> String) -> Result<Array> {
    let (s, d, bytes) = decode(m)?;
    if s != shape || d != dtype {
        return Err(Error::InvalidArgument(mismatch(&s, d)));
    }
    Ok(Array::from_raw_bytes(bytes, &s[..], d))
}

/// A folder holding `libnccl.so`, linked to the NCCL library found ([`nuvec_cuda::nccl::nccl_library`]),
/// when NCCL is there but not under the name cudarc opens; `None` otherwise.
fn nccl_link_folder() -> Option<std::path::PathBuf> {
    let lib = nuvec_cuda::nccl::nccl_library()?;
    if nccl_unavailable_reason().is_none() || lib.file_name().is_some_and(|n| n == "libnccl.so") {
        return None;
    }
    let dir = std::env::temp_dir().join(format!("nuvec-nccl-{}", std::process::id()));
    let link = dir.join("libnccl.so");
    std::fs::create_dir_all(&dir).ok()?;
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&lib, &link).ok()?;
    Some(dir)
}

/// Runs `program` with `args` as `n` ranks on this machine (each with [`RANK_VAR`],
/// [`SIZE_VAR`] and [`HOSTS_VAR`] naming free loopback ports, on a machine of several GPUs
/// `NUVEC_DEVICE=gpu:<rank>` unless a device is named, `NCCL_NVLS_ENABLE=0`, NCCL's
/// library findable under the name cudarc opens (a linked folder on `LD_LIBRARY_PATH`), and `env`)
/// and waits for them. When one fails, the others get `grace` to end on their own (their
/// collectives fail within their time-out) before they are killed; the error names the first
/// rank that failed.
pub fn launch(n: usize, program: &Path, args: &[String], env: &[(&str, &str)], grace: Duration) -> Result<()> {
    if n == 0 {
        return Err(Error::InvalidArgument("distributed::launch: at least one rank".into()));
    }
    let io = |e: std::io::Error| Error::Io(format!("distributed::launch: {}: {e}", program.display()));
    // Free ports: bound once, then released for the ranks to bind.
    let listeners =
        (0..n).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<Vec<_>>>().map_err(io)?;
    let hosts: Vec<String> =
        listeners.iter().map(|l| l.local_addr().map(|a| a.to_string())).collect::<std::io::Result<_>>().map_err(io)?;
    drop(listeners);
    let library_path = nccl_link_folder().map(|dir| {
        let old = std::env::var("LD_LIBRARY_PATH").unwrap_or_default();
        if old.is_empty() { dir.display().to_string() } else { format!("{}:{old}", dir.display()) }
    });
    // One process per GPU: rank r's default device is GPU r (modulo their count), unless the
    // caller names a device.
    let gpus = nuvec_cuda::device_count();
    let own_gpu = |r: usize| {
        (gpus > 1 && std::env::var_os("NUVEC_DEVICE").is_none() && !env.iter().any(|(k, _)| *k == "NUVEC_DEVICE"))
            .then(|| format!("gpu:{}", r % gpus))
    };
    let mut children: Vec<Child> = (0..n)
        .map(|r| {
            Command::new(program)
                .args(args)
                .envs(own_gpu(r).map(|d| ("NUVEC_DEVICE", d)))
                .env(RANK_VAR, r.to_string())
                .env(SIZE_VAR, n.to_string())
                .env(HOSTS_VAR, hosts.join(","))
                .env("NCCL_NVLS_ENABLE", "0")
                .envs(library_path.iter().map(|p| ("LD_LIBRARY_PATH", p.as_str())))
                .envs(env.iter().copied())
                .spawn()
        })
        .collect::<std::io::Result<_>>()
        .map_err(io)?;
    let mut status: Vec<Option<std::process::ExitStatus>> = vec![None; n];
    let mut failed: Option<(usize, Instant)> = None;
    loop {
        for (r, c) in children.iter_mut().enumerate() {
            if status[r].is_none()
                && let Some(s) = c.try_wait().map_err(io)?
            {
                status[r] = Some(s);
                if !s.success() && failed.is_none() {
                    failed = Some((r, Instant::now()));
                }
            }
        }
        if status.iter().all(Option::is_some) {
            break;
        }
        if let Some((_, since)) = failed
            && since.elapsed() >= grace
        {
            for (r, c) in children.iter_mut().enumerate() {
                if status[r].is_none() {
                    let _ = c.kill();
                    status[r] = c.wait().ok();
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    match failed {
        Some((r, _)) => Err(Error::Backend(format!(
            "distributed::launch: rank {r} of {n} failed ({})",
            status[r].map_or("killed".to_string(), |s| s.to_string())
        ))),
        None => Ok(()),
    }
}
