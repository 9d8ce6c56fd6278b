//! The commands: each request applied to the key space in arrival order (SET, GET, ADD, CAS,
//! queues, key listing, BARRIER), and the waiters (WAIT, BARRIER, blocking queue pops) parked
//! per key and woken by the write that satisfies them.

use super::*;

impl EventLoop {
    pub(super) fn exists(&self, k: &[u8]) -> bool {
        self.kv.contains_key(k) || self.queues.get(k).is_some_and(|q| !q.is_empty())
    }

    /// Applies one request from connection `id`. `Err` closes the connection.
    pub(super) fn handle(&mut self, id: usize, req: Request) -> std::result::Result<(), String> {
        match req {
            Request::Validate(m) => {
                // A repeated VALIDATE is harmless; a wrong magic is not.
                if m != VALIDATE_MAGIC {
                    return Err(format!("VALIDATE with wrong magic {m:#x}"));
                }
            }
            Request::Ping(n) => self.out(id).extend_from_slice(&n.to_le_bytes()),
            // `wake` reads neither `kv` nor `queues`, so writes wake first and then move their
            // key into the map (no key copy); a reply, if any, is queued before the wake-up.
            Request::Set(k, v) => {
                self.wake(&k);
                self.kv.insert(k, Arc::new(v));
            }
            Request::CompareSet(k, expected, desired) => self.compare_set(id, k, expected, desired),
            Request::Get(k) => self.get(id, &[k]),
            Request::Add(k, delta) => self.add(id, k, delta)?,
            Request::Check(keys) => {
                let ready = keys.iter().all(|k| self.exists(k));
                self.out(id).push(if ready { 0 } else { 1 });
            }
            Request::Wait(keys) => self.wait(id, keys),
            Request::GetNumKeys => {
                let n = self.kv.len() as i64;
                put_i64(self.out(id), n);
            }
            Request::DeleteKey(k) => {
                let n = i64::from(self.kv.remove(&k).is_some());
                put_i64(self.out(id), n);
            }
            Request::Append(k, v) => {
                self.wake(&k);
                // Copies the value only when a pending reply still references it.
                Arc::make_mut(self.kv.entry(k).or_default()).extend_from_slice(&v);
            }
            Request::MultiGet(keys) => self.get(id, &keys),
            Request::MultiSet(kvs) => {
                for (k, v) in kvs {
                    self.wake(&k);
                    self.kv.insert(k, Arc::new(v));
                }
            }
            Request::CancelWait => self.cancel_wait(id),
            Request::QueuePush(k, v) => {
                self.wake_one(&k);
                self.queues.entry(k).or_default().push_back(v);
            }
            Request::QueuePop(k) => self.queue_pop(id, &k),
            Request::QueueLen(k) => {
                let len = self.queues.get(&k).map_or(0, |q| q.len()) as i64;
                put_i64(self.out(id), len);
            }
            Request::ListKeys => self.list_keys(id),
            Request::Barrier(k, world_size) => self.barrier(id, k, world_size)?,
        }
        Ok(())
    }

    /// COMPARE_SET: missing with empty `expected`, or equal: store and reply `desired`; missing
    /// otherwise: reply `expected`; else reply the current value.
    pub(super) fn compare_set(
        &mut self,
        id: usize,
        k: Vec<u8>,
        expected: Vec<u8>,
        desired: Vec<u8>,
    ) {
        let swap = self
            .kv
            .get(&k)
            .map_or(expected.is_empty(), |cur| **cur == expected);
        let out = &mut self.conns.get_mut(&id).expect("serving connection").out;
        if swap {
            put_bytes(&mut out.tail, &desired);
        } else if let Some(cur) = self.kv.get(&k) {
            out.push_value(cur);
        } else {
            put_bytes(&mut out.tail, &expected);
        }
        // libuv wakes waiters in every branch (store-protocol.md §3 quirk).
        self.wake(&k);
        if swap {
            self.kv.insert(k, Arc::new(desired));
        }
    }

    /// GET / MULTI_GET: each value, or an empty one for a missing key. Large values are
    /// referenced, not copied: the reply costs memory for its small values only, however large
    /// it is (back-pressure paces the rest).
    pub(super) fn get(&mut self, id: usize, keys: &[Vec<u8>]) {
        let out = &mut self.conns.get_mut(&id).expect("serving connection").out;
        for k in keys {
            match self.kv.get(k) {
                Some(v) => out.push_value(v),
                None => put_u64(&mut out.tail, 0),
            }
        }
    }

    /// ADD: the key's integer value (0 when missing) plus `delta`, stored and replied.
    ///
    /// # Errors
    /// The key holds something other than an integer.
    pub(super) fn add(
        &mut self,
        id: usize,
        k: Vec<u8>,
        delta: i64,
    ) -> std::result::Result<(), String> {
        let cur = match self.kv.get(&k) {
            None => 0,
            Some(v) => parse_stoll(v).ok_or_else(|| {
                format!(
                    "ADD on key {:?} whose value {:?} is not an integer",
                    String::from_utf8_lossy(&k),
                    String::from_utf8_lossy(v)
                )
            })?,
        };
        let new = cur.wrapping_add(delta);
        if k == b"init/" {
            if let Some(ws) = self.world_size {
                if new == ws as i64 {
                    log::info!("c10d-store server: all {ws} workers joined");
                }
            }
        }
        put_i64(self.out(id), new);
        self.wake(&k);
        self.kv.insert(k, Arc::new(new.to_string().into_bytes()));
        Ok(())
    }

    /// WAIT: STOP_WAITING now when every key exists, else registers on the missing ones.
    pub(super) fn wait(&mut self, id: usize, keys: Vec<Vec<u8>>) {
        if keys.iter().all(|k| self.exists(k)) {
            self.out(id).push(STOP_WAITING);
            return;
        }
        // Register on the keys absent from the key map; one key does not exist, so at least one
        // is absent.
        let missing: Vec<Vec<u8>> = keys
            .into_iter()
            .filter(|k| !self.kv.contains_key(k))
            .collect();
        debug_assert!(!missing.is_empty());
        for k in &missing {
            self.waiters.entry(k.clone()).or_default().push(id);
        }
        let c = self.conns.get_mut(&id).expect("serving connection");
        c.awaiting += missing.len();
        c.wait_keys.extend(missing);
    }

    /// CANCEL_WAIT: drops the connection's registrations and replies WAIT_CANCELED.
    pub(super) fn cancel_wait(&mut self, id: usize) {
        let c = self.conns.get_mut(&id).expect("serving connection");
        c.awaiting = 0;
        let keys = std::mem::take(&mut c.wait_keys);
        for k in keys {
            self.unregister(&k, id);
        }
        self.out(id).push(crate::tcp::protocol::WAIT_CANCELED);
    }

    /// QUEUE_POP: the queue's length before the pop, then the item when there was one.
    pub(super) fn queue_pop(&mut self, id: usize, k: &[u8]) {
        let q = self.queues.get_mut(k);
        let len = q.as_ref().map_or(0, |q| q.len()) as i64;
        let item = q.and_then(|q| q.pop_front());
        if self.queues.get(k).is_some_and(|q| q.is_empty()) {
            self.queues.remove(k);
        }
        let out = self.out(id);
        put_i64(out, len);
        if let Some(item) = item {
            put_bytes(out, &item);
        }
    }

    /// LIST_KEYS: the number of keys, then each key.
    pub(super) fn list_keys(&mut self, id: usize) {
        let mut out = std::mem::take(self.out(id));
        put_i64(&mut out, self.kv.len() as i64);
        for k in self.kv.keys() {
            put_bytes(&mut out, k);
        }
        *self.out(id) = out;
    }

    /// BARRIER: counts the arrival; the last of `world_size` wakes everyone, others wait.
    ///
    /// # Errors
    /// The key holds something other than an integer.
    pub(super) fn barrier(
        &mut self,
        id: usize,
        k: Vec<u8>,
        world_size: i64,
    ) -> std::result::Result<(), String> {
        let count = match self.kv.get(&k) {
            None => 1,
            Some(v) => parse_stoll(v)
                .ok_or_else(|| {
                    format!(
                        "BARRIER on key {:?} whose value is not an integer",
                        String::from_utf8_lossy(&k)
                    )
                })?
                .wrapping_add(1),
        };
        self.kv
            .insert(k.clone(), Arc::new(count.to_string().into_bytes()));
        if count >= world_size {
            self.wake(&k);
            self.out(id).push(STOP_WAITING);
        } else {
            self.waiters.entry(k.clone()).or_default().push(id);
            let c = self.conns.get_mut(&id).expect("serving connection");
            c.awaiting += 1;
            c.wait_keys.push(k);
        }
        Ok(())
    }

    /// A write touched `key`: every registered connection loses one outstanding key; those that
    /// reach zero get STOP_WAITING.
    pub(super) fn wake(&mut self, key: &[u8]) {
        let Some(list) = self.waiters.remove(key) else {
            return;
        };
        for w in list {
            if self.conns.get_mut(&w).is_some_and(|c| c.release(key)) {
                self.dirty.push(w);
            }
        }
    }

    /// A queue push: wake only the first waiter whose count reaches zero (removing it and every
    /// waiter walked past, whose registration on this key was consumed).
    pub(super) fn wake_one(&mut self, key: &[u8]) {
        let Some(list) = self.waiters.get_mut(key) else {
            return;
        };
        let mut consumed = 0;
        let mut woken = None;
        for &w in list.iter() {
            consumed += 1;
            if self.conns.get_mut(&w).is_some_and(|c| c.release(key)) {
                woken = Some(w);
                break;
            }
        }
        list.drain(..consumed);
        if list.is_empty() {
            self.waiters.remove(key);
        }
        if let Some(w) = woken {
            self.dirty.push(w);
        }
    }
}
