//! A prefix cache like vLLM's: KV blocks of `block_size` tokens, identified by chained hashes.
//!
//! `cached_tokens` of a request is the number of tokens in its leading blocks that an earlier
//! request already computed; a hit never covers the last prompt token. After the prefill the
//! request's blocks are inserted; the least recently used blocks are evicted past capacity.

use std::collections::{HashMap, VecDeque};

pub struct PrefixCache {
    block_size: usize,
    capacity: usize,
    tick: u64,
    blocks: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
}

impl PrefixCache {
    pub fn new(block_size: usize, capacity: usize) -> Self {
        PrefixCache {
            block_size: block_size.max(1),
            capacity: capacity.max(1),
            tick: 0,
            blocks: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn hashes(&self, ids: &[u32]) -> Vec<u64> {
        let mut prev: u64 = 0xcbf2_9ce4_8422_2325;
        ids.chunks_exact(self.block_size)
            .map(|block| {
                for &id in block {
                    prev ^= u64::from(id);
                    prev = prev.wrapping_mul(0x0000_0100_0000_01b3);
                }
                prev
            })
            .collect()
    }

    /// Looks up and then inserts `ids`; returns the cached token count.
    pub fn prefill(&mut self, ids: &[u32]) -> usize {
        let hashes = self.hashes(ids);
        let max_blocks = ids.len().saturating_sub(1) / self.block_size;
        let hit = hashes
            .iter()
            .take(max_blocks)
            .take_while(|h| self.blocks.contains_key(h))
            .count();
        for h in hashes {
            self.tick += 1;
            self.blocks.insert(h, self.tick);
            self.order.push_back((h, self.tick));
        }
        while self.blocks.len() > self.capacity {
            match self.order.pop_front() {
                Some((h, t)) => {
                    if self.blocks.get(&h) == Some(&t) {
                        self.blocks.remove(&h);
                    }
                }
                None => break,
            }
        }
        if self.order.len() > self.capacity * 4 {
            let live = &self.blocks;
            self.order.retain(|(h, t)| live.get(h) == Some(t));
        }
        hit * self.block_size
    }

    pub fn clear(&mut self) {
        self.blocks.clear();
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multi_turn_hits_grow_and_last_token_is_never_cached() {
        let mut c = PrefixCache::new(4, 1000);
        let turn1: Vec<u32> = (0..10).collect();
        assert_eq!(c.prefill(&turn1), 0);
        let turn2: Vec<u32> = (0..20).collect();
        assert_eq!(c.prefill(&turn2), 8);
        assert_eq!(
            c.prefill(&turn2),
            16,
            "19 cacheable tokens round down to 16"
        );
        let exact: Vec<u32> = (0..8).collect();
        assert_eq!(c.prefill(&exact), 4, "the last block holds the last token");
    }

    #[test]
    fn eviction() {
        let mut c = PrefixCache::new(2, 2);
        c.prefill(&[1, 2, 3, 4, 5]);
        c.prefill(&[9, 9, 9, 9, 9]);
        assert_eq!(c.prefill(&[1, 2, 3, 4, 5]), 0);
    }
}
