//! The host-side bookkeeping of a paged KV cache shared by many requests, as vLLM's block
//! manager keeps it: which blocks of the pool each request holds, how many requests hold each
//! block, and which full blocks hold which tokens, so that a prompt starting as an earlier one
//! did reads that one's blocks instead of computing them again (prefix caching).
//!
//! A full block is named by a hash of its tokens and of the blocks before it, so one name
//! means one whole prefix. A block no request holds any more stays cached under its name
//! until the pool needs it (least recently released first).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

/// Blocks of one pool: held (reference-counted), cached (full, named, held by no request) or
/// free. See the module docs.
#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    capacity: usize,
    /// Requests holding each block.
    refs: Vec<u32>,
    /// Blocks never named or no longer named; the lowest is taken first, so that the pools
    /// stay as small as they can.
    free: BTreeSet<i32>,
    /// Full blocks by name, with the tokens they hold (a name matches only with them).
    named: HashMap<u64, (i32, Vec<u32>)>,
    /// Each block's name, while it has one.
    name_of: Vec<Option<u64>>,
    /// Named blocks no request holds, by when they were released (oldest first).
    idle: BTreeMap<u64, i32>,
    /// Each idle block's key in `idle`.
    idle_at: Vec<Option<u64>>,
    clock: u64,
}

/// The name of a full block holding `tokens` after the blocks named up to `parent`.
pub fn block_name(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl BlockPool {
    /// A pool of `capacity` blocks of `block_size` positions, all free.
    pub fn new(block_size: usize, capacity: usize) -> BlockPool {
        BlockPool {
            block_size: block_size.max(1),
            capacity,
            refs: vec![0; capacity],
            free: (0..capacity as i32).collect(),
            named: HashMap::new(),
            name_of: vec![None; capacity],
            idle: BTreeMap::new(),
            idle_at: vec![None; capacity],
            clock: 0,
        }
    }

    /// Positions per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks in the pool.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Blocks some request holds.
    pub fn held(&self) -> usize {
        self.capacity - self.available()
    }

    /// Blocks no request holds that keep their tokens for later prompts.
    pub fn cached(&self) -> usize {
        self.idle.len()
    }

    /// Blocks a request could take now (free ones, then cached ones).
    pub fn available(&self) -> usize {
        self.free.len() + self.idle.len()
    }

    /// The blocks naming the longest run of `tokens`' full blocks already in the pool, at most
    /// `limit` tokens' worth, each now held once more, and the last one's name (0 for none),
    /// which the next block's name follows.
    pub fn lookup(&mut self, tokens: &[u32], limit: usize) -> (Vec<i32>, u64) {
        let mut found = Vec::new();
        let mut parent = 0;
        for chunk in tokens[..limit.min(tokens.len())].chunks_exact(self.block_size) {
            let name = block_name(parent, chunk);
            match self.named.get(&name) {
                Some((block, held)) if held == chunk => found.push(*block),
                _ => break,
            }
            parent = name;
        }
        for &b in &found {
            self.hold(b);
        }
        (found, parent)
    }

    /// Holds `block` once more (it leaves the idle blocks).
    fn hold(&mut self, block: i32) {
        let b = block as usize;
        if let Some(at) = self.idle_at[b].take() {
            self.idle.remove(&at);
        }
        self.refs[b] += 1;
    }

    /// A block for a request: a free one, else the cached one released longest ago (its name
    /// forgotten); `None` when every block is held.
    pub fn take(&mut self) -> Option<i32> {
        let block = match self.free.pop_first() {
            Some(b) => b,
            None => {
                let (_, b) = self.idle.pop_first()?;
                self.idle_at[b as usize] = None;
                if let Some(name) = self.name_of[b as usize].take() {
                    self.named.remove(&name);
                }
                b
            }
        };
        self.refs[block as usize] = 1;
        Some(block)
    }

    /// Names the full `block`, which holds `tokens` after the blocks named up to `parent`;
    /// returns the name. A name already given to another block stays with that one.
    pub fn name(&mut self, block: i32, parent: u64, tokens: &[u32]) -> u64 {
        let name = block_name(parent, tokens);
        if self.name_of[block as usize].is_none() && !self.named.contains_key(&name) {
            self.named.insert(name, (block, tokens.to_vec()));
            self.name_of[block as usize] = Some(name);
        }
        name
    }

    /// A request lets go of `blocks`: those no request holds any more stay cached under their
    /// names, or become free.
    pub fn release(&mut self, blocks: &[i32]) {
        for &block in blocks {
            let b = block as usize;
            debug_assert!(self.refs[b] > 0, "block {block} released more often than held");
            // A block no one holds is already free or cached: listing it twice would give it
            // to two requests.
            if self.refs[b] == 0 {
                continue;
            }
            self.refs[b] -= 1;
            if self.refs[b] > 0 {
                continue;
            }
            if self.name_of[b].is_some() {
                self.clock += 1;
                self.idle.insert(self.clock, block);
                self.idle_at[b] = Some(self.clock);
            } else {
                self.free.insert(block);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_shared_cached_and_reused_oldest_first() {
        let mut pool = BlockPool::new(2, 4);
        let a = [pool.take().unwrap(), pool.take().unwrap()];
        assert_eq!(a, [0, 1]);
        let n0 = pool.name(a[0], 0, &[1, 2]);
        pool.name(a[1], n0, &[3, 4]);
        // The same tokens find both blocks; a prompt differing in the second block, the first.
        assert_eq!(pool.lookup(&[1, 2, 3, 4, 5], 5).0, vec![0, 1]);
        assert_eq!(pool.lookup(&[1, 2, 3, 9], 4), (vec![0], n0));
        // A limit of three tokens covers one full block.
        assert_eq!(pool.lookup(&[1, 2, 3, 4], 3).0, vec![0]);
        assert_eq!(pool.held(), 2);
        pool.release(&[0, 1]);
        pool.release(&[0, 1]);
        pool.release(&[0]);
        pool.release(&[0]);
        assert_eq!((pool.held(), pool.cached(), pool.available()), (0, 2, 4));
        // Free blocks go first, then the cached block released longest ago (1, then 0).
        let taken: Vec<i32> = (0..4).map(|_| pool.take().unwrap()).collect();
        assert_eq!(taken, vec![2, 3, 1, 0]);
        assert_eq!(pool.take(), None);
        assert!(pool.lookup(&[1, 2, 3, 4], 4).0.is_empty(), "reused blocks lose their names");
    }

    #[test]
    fn a_name_needs_the_same_tokens_and_the_same_prefix() {
        let mut pool = BlockPool::new(2, 3);
        let b = pool.take().unwrap();
        let n = pool.name(b, 0, &[7, 8]);
        let c = pool.take().unwrap();
        pool.name(c, n, &[9, 9]);
        // The block [9, 9] after another first block is not the one named.
        assert!(pool.lookup(&[7, 7, 9, 9], 4).0.is_empty());
        // A second block with a name already given keeps none.
        let d = pool.take().unwrap();
        assert_eq!(pool.name(d, 0, &[7, 8]), n);
        pool.release(&[d]);
        assert_eq!((pool.cached(), pool.available()), (0, 1));
    }
}
