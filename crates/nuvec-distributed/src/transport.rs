//! How a group's ranks move bytes: threads of one process through channels
//! ([`Group::local`](crate::Group::local)), or processes through a mesh of loopback or network
//! TCP connections ([`Group::tcp`](crate::Group::tcp)). Every wait is bounded by the group's
//! time-out, and a peer that is gone is an error, so a rank that dies ends the group with an
//! error on every other rank instead of a hang.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, channel};
use std::time::{Duration, Instant};

use nuvec_core::{Error, Result};

/// Moves whole messages between the ranks of a group.
pub(crate) trait Transport: Send + Sync {
    /// Sends `bytes` to rank `dst` as one message.
    fn send(&self, dst: usize, bytes: &[u8]) -> Result<()>;
    /// The next message from rank `src`.
    fn recv(&self, src: usize) -> Result<Vec<u8>>;
}

/// The error of a transfer with a rank that failed or left.
pub(crate) fn peer_error(what: &str, peer: usize, why: impl std::fmt::Display) -> Error {
    Error::Backend(format!("distributed: {what} rank {peer} failed: {why} (the group cannot go on)"))
}

/// Ranks as threads of one process: a channel per ordered pair of ranks.
pub(crate) struct Channels {
    to: Vec<Mutex<Sender<Vec<u8>>>>,
    from: Vec<Mutex<Receiver<Vec<u8>>>>,
    timeout: Duration,
}

impl Channels {
    /// The `n` ranks' ends, rank order.
    pub(crate) fn group(n: usize, timeout: Duration) -> Vec<Channels> {
        // pairs[s][d]: the channel from rank s to rank d.
        let mut senders: Vec<Vec<Option<Sender<Vec<u8>>>>> = (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        let mut receivers: Vec<Vec<Option<Receiver<Vec<u8>>>>> =
            (0..n).map(|_| (0..n).map(|_| None).collect()).collect();
        for (s, row) in senders.iter_mut().enumerate() {
            for (d, slot) in row.iter_mut().enumerate() {
                let (tx, rx) = channel();
                *slot = Some(tx);
                receivers[d][s] = Some(rx);
            }
        }
        senders
            .into_iter()
            .zip(receivers)
            .map(|(to, from)| Channels {
                to: to.into_iter().flatten().map(Mutex::new).collect(),
                from: from.into_iter().flatten().map(Mutex::new).collect(),
                timeout,
            })
            .collect()
    }
}

impl Transport for Channels {
    fn send(&self, dst: usize, bytes: &[u8]) -> Result<()> {
        let tx = self.to[dst].lock().unwrap_or_else(|e| e.into_inner());
        tx.send(bytes.to_vec()).map_err(|_| peer_error("sending to", dst, "it left the group"))
    }

    fn recv(&self, src: usize) -> Result<Vec<u8>> {
        let rx = self.from[src].lock().unwrap_or_else(|e| e.into_inner());
        rx.recv_timeout(self.timeout).map_err(|e| match e {
            RecvTimeoutError::Timeout => peer_error("waiting for", src, format!("nothing came in {:?}", self.timeout)),
            RecvTimeoutError::Disconnected => peer_error("waiting for", src, "it left the group"),
        })
    }
}

/// Ranks as processes: a TCP connection per pair of ranks, each message a little-endian `u64`
/// length and its bytes.
pub(crate) struct Tcp {
    rank: usize,
    /// Per peer (none for this rank): the stream read from and a clone written to.
    peers: Vec<Option<(Mutex<TcpStream>, Mutex<TcpStream>)>>,
}

impl Tcp {
    /// Rank `rank` of `addrs.len()` ranks, rank `i` listening on `addrs[i]`: connects to the
    /// ranks before it and accepts the ranks after it, each side naming its rank first. Gives up
    /// after `timeout`.
    pub(crate) fn connect(rank: usize, addrs: &[SocketAddr], timeout: Duration) -> Result<Tcp> {
        let n = addrs.len();
        let io = |what: String| move |e: std::io::Error| Error::Io(format!("distributed: rank {rank}: {what}: {e}"));
        let deadline = Instant::now() + timeout;
        let mut peers: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
        let listener = if rank + 1 < n {
            let l = TcpListener::bind(addrs[rank]).map_err(io(format!("listening on {}", addrs[rank])))?;
            l.set_nonblocking(true).map_err(io("the listener".into()))?;
            Some(l)
        } else {
            None
        };
        for (peer, addr) in addrs.iter().enumerate().take(rank) {
            let mut stream = loop {
                match TcpStream::connect_timeout(addr, Duration::from_millis(500)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() >= deadline => {
                        return Err(peer_error("connecting to", peer, format!("{addr}: {e}")));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            };
            stream.write_all(&(rank as u32).to_le_bytes()).map_err(io(format!("greeting rank {peer}")))?;
            peers[peer] = Some(stream);
        }
        if let Some(listener) = listener {
            let mut left = n - rank - 1;
            while left > 0 {
                match listener.accept() {
                    Ok((mut stream, _)) => {
                        stream.set_nonblocking(false).map_err(io("a connection".into()))?;
                        stream.set_read_timeout(Some(timeout)).map_err(io("a connection".into()))?;
                        let mut id = [0u8; 4];
                        stream.read_exact(&mut id).map_err(io("reading a peer's rank".into()))?;
                        let peer = u32::from_le_bytes(id) as usize;
                        if peer <= rank || peer >= n || peers[peer].is_some() {
                            return Err(Error::Io(format!("distributed: rank {rank}: unexpected peer rank {peer}")));
                        }
                        peers[peer] = Some(stream);
                        left -= 1;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() >= deadline {
                            let missing: Vec<usize> = (rank + 1..n).filter(|&p| peers[p].is_none()).collect();
                            return Err(peer_error("waiting for", missing[0], format!("no connection in {timeout:?}")));
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(io("accepting".into())(e)),
                }
            }
        }
        let peers = peers
            .into_iter()
            .map(|s| {
                s.map(|s| -> Result<_> {
                    s.set_read_timeout(Some(timeout)).map_err(io("a connection".into()))?;
                    s.set_write_timeout(Some(timeout)).map_err(io("a connection".into()))?;
                    s.set_nodelay(true).map_err(io("a connection".into()))?;
                    let w = s.try_clone().map_err(io("a connection".into()))?;
                    Ok((Mutex::new(s), Mutex::new(w)))
                })
                .transpose()
            })
            .collect::<Result<_>>()?;
        Ok(Tcp { rank, peers })
    }

    fn peer(&self, p: usize) -> Result<&(Mutex<TcpStream>, Mutex<TcpStream>)> {
        self.peers
            .get(p)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::InvalidArgument(format!("distributed: rank {} has no peer {p}", self.rank)))
    }
}

impl Transport for Tcp {
    fn send(&self, dst: usize, bytes: &[u8]) -> Result<()> {
        let mut w = self.peer(dst)?.1.lock().unwrap_or_else(|e| e.into_inner());
        w.write_all(&(bytes.len() as u64).to_le_bytes())
            .and_then(|_| w.write_all(bytes))
            .map_err(|e| peer_error("sending to", dst, e))
    }

    fn recv(&self, src: usize) -> Result<Vec<u8>> {
        let mut r = self.peer(src)?.0.lock().unwrap_or_else(|e| e.into_inner());
        let mut len = [0u8; 8];
        r.read_exact(&mut len).map_err(|e| peer_error("waiting for", src, e))?;
        let mut bytes = vec![0u8; u64::from_le_bytes(len) as usize];
        r.read_exact(&mut bytes).map_err(|e| peer_error("waiting for", src, e))?;
        Ok(bytes)
    }
}
