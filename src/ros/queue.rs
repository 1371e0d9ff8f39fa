//! A bounded latest-wins queue between the ROS executor (producer) and the processing thread
//! (consumer). `push` never blocks: when the queue is full the oldest waiting item is dropped and
//! counted, so a slow stage always works on the newest clouds and the executor never stalls.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

pub struct LatestQueue<T> {
    state: Mutex<State<T>>,
    ready: Condvar,
    capacity: AtomicUsize,
    pushed: AtomicU64,
    dropped: AtomicU64,
}

struct State<T> {
    items: VecDeque<T>,
    closed: bool,
}

/// What [`LatestQueue::pop_timeout`] found.
#[derive(Debug, PartialEq)]
pub enum Pop<T> {
    Item(T),
    TimedOut,
    Closed,
}

impl<T> LatestQueue<T> {
    /// `capacity` is clamped to at least 1.
    pub fn new(capacity: usize) -> Self {
        Self {
            state: Mutex::new(State { items: VecDeque::new(), closed: false }),
            ready: Condvar::new(),
            capacity: AtomicUsize::new(capacity.max(1)),
            pushed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity.load(Ordering::Relaxed)
    }

    /// Changes the capacity; items over it are dropped (oldest first) at the next push.
    pub fn set_capacity(&self, capacity: usize) {
        self.capacity.store(capacity.max(1), Ordering::Relaxed);
    }

    /// Adds `item`; returns how many older items were dropped to make room. A closed queue drops
    /// `item` itself (counted too).
    pub fn push(&self, item: T) -> usize {
        self.pushed.fetch_add(1, Ordering::Relaxed);
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.closed {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return 1;
        }
        let cap = self.capacity();
        let mut dropped = 0;
        while st.items.len() >= cap {
            st.items.pop_front();
            dropped += 1;
        }
        st.items.push_back(item);
        drop(st);
        if dropped > 0 {
            self.dropped.fetch_add(dropped as u64, Ordering::Relaxed);
        }
        self.ready.notify_one();
        dropped
    }

    /// Waits up to `timeout` for the oldest waiting item.
    pub fn pop_timeout(&self, timeout: Duration) -> Pop<T> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (mut st, _) = self
            .ready
            .wait_timeout_while(st, timeout, |s| s.items.is_empty() && !s.closed)
            .unwrap_or_else(|e| e.into_inner());
        match st.items.pop_front() {
            Some(item) => Pop::Item(item),
            None if st.closed => Pop::Closed,
            None => Pop::TimedOut,
        }
    }

    /// Wakes every waiter; later pops return what is left, then [`Pop::Closed`].
    pub fn close(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).closed = true;
        self.ready.notify_all();
    }

    pub fn len(&self) -> usize {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Items ever pushed.
    pub fn pushed(&self) -> u64 {
        self.pushed.load(Ordering::Relaxed)
    }

    /// Items dropped because newer ones arrived while the queue was full (or after close).
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn keeps_the_newest_and_counts_drops() {
        let q = LatestQueue::new(2);
        assert_eq!(q.push(1), 0);
        assert_eq!(q.push(2), 0);
        assert_eq!(q.push(3), 1);
        assert_eq!(q.push(4), 1);
        assert_eq!(q.dropped(), 2);
        assert_eq!(q.pushed(), 4);
        assert_eq!(q.pop_timeout(Duration::ZERO), Pop::Item(3));
        assert_eq!(q.pop_timeout(Duration::ZERO), Pop::Item(4));
        assert_eq!(q.pop_timeout(Duration::from_millis(1)), Pop::TimedOut);
    }

    #[test]
    fn capacity_one_is_latest_wins() {
        let q = LatestQueue::new(0);
        assert_eq!(q.capacity(), 1);
        for i in 0..10 {
            q.push(i);
        }
        assert_eq!(q.dropped(), 9);
        assert_eq!(q.pop_timeout(Duration::ZERO), Pop::Item(9));
    }

    #[test]
    fn close_wakes_a_waiting_consumer() {
        let q = Arc::new(LatestQueue::<u32>::new(1));
        let q2 = q.clone();
        let t = std::thread::spawn(move || q2.pop_timeout(Duration::from_secs(30)));
        std::thread::sleep(Duration::from_millis(20));
        q.close();
        assert_eq!(t.join().unwrap(), Pop::Closed);
        assert_eq!(q.push(5), 1, "a closed queue drops new items");
    }

    #[test]
    fn producer_never_blocks_on_a_slow_consumer() {
        let q = Arc::new(LatestQueue::new(1));
        let q2 = q.clone();
        let consumer = std::thread::spawn(move || {
            let mut got = Vec::new();
            loop {
                match q2.pop_timeout(Duration::from_secs(5)) {
                    Pop::Item(v) => {
                        got.push(v);
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Pop::Closed | Pop::TimedOut => return got,
                }
            }
        });
        let t0 = std::time::Instant::now();
        for i in 0..1000u32 {
            q.push(i);
        }
        assert!(t0.elapsed() < Duration::from_secs(1));
        std::thread::sleep(Duration::from_millis(20));
        q.close();
        let got = consumer.join().unwrap();
        assert!(got.windows(2).all(|w| w[0] < w[1]), "in order");
        assert_eq!(*got.last().unwrap(), 999, "the newest is always processed");
        assert_eq!(got.len() as u64 + q.dropped(), 1000);
    }
}
