//! Reading a response body without ever holding more than a limit.
//!
//! The body is streamed frame by frame into a [`LimitedBuffer`], which refuses a frame that would
//! take it past its limit and never lets its allocation grow past the limit either (a plain
//! `Vec` doubles its capacity, so a 16 MiB limit could otherwise allocate 32 MiB). A legacy
//! fetch reads dozens of documents; a shared [`Budget`] also bounds their sum.

use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt;

/// The body went past a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OverLimit {
    pub limit: usize,
    /// The shared [`Budget`] was exhausted, not the per-document limit.
    pub total: bool,
}

/// Bytes left for all the documents of one fetch (shared by concurrent requests).
#[derive(Debug)]
pub struct Budget {
    total: usize,
    left: AtomicUsize,
}

impl Budget {
    pub fn new(total: usize) -> Self {
        Budget {
            total,
            left: AtomicUsize::new(total),
        }
    }

    /// Take `n` bytes; `false` (and nothing taken) when fewer are left.
    pub fn take(&self, n: usize) -> bool {
        self.left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| {
                left.checked_sub(n)
            })
            .is_ok()
    }

    pub fn total(&self) -> usize {
        self.total
    }

    pub fn left(&self) -> usize {
        self.left.load(Ordering::Relaxed)
    }
}

/// A growing buffer that never holds nor allocates more than `limit` bytes.
#[derive(Debug)]
pub struct LimitedBuffer<'a> {
    buf: Vec<u8>,
    limit: usize,
    budget: Option<&'a Budget>,
}

/// What we allocate up front at most, whatever `Content-Length` says (it may lie).
const MAX_PREALLOCATION: usize = 1024 * 1024;

impl<'a> LimitedBuffer<'a> {
    /// `declared`: the `Content-Length`, if any; over the limit fails at once.
    pub fn new(
        limit: usize,
        declared: Option<u64>,
        budget: Option<&'a Budget>,
    ) -> Result<Self, OverLimit> {
        let mut initial = 0;
        if let Some(declared) = declared {
            if declared > limit as u64 {
                return Err(OverLimit {
                    limit,
                    total: false,
                });
            }
            if let Some(b) = budget {
                if declared > b.left() as u64 {
                    return Err(OverLimit {
                        limit: b.total(),
                        total: true,
                    });
                }
            }
            initial = (declared as usize).min(MAX_PREALLOCATION);
        }
        Ok(LimitedBuffer {
            buf: Vec::with_capacity(initial),
            limit,
            budget,
        })
    }

    /// Append a chunk, or refuse it (the buffer is then to be dropped).
    pub fn push(&mut self, chunk: &[u8]) -> Result<(), OverLimit> {
        let len = self.buf.len() + chunk.len();
        if len > self.limit {
            return Err(OverLimit {
                limit: self.limit,
                total: false,
            });
        }
        if let Some(b) = self.budget {
            if !b.take(chunk.len()) {
                return Err(OverLimit {
                    limit: b.total(),
                    total: true,
                });
            }
        }
        if len > self.buf.capacity() {
            // Amortised doubling, but never past the limit.
            let target = (self.buf.capacity() * 2).max(len).min(self.limit);
            self.buf.reserve_exact(target - self.buf.len());
        }
        self.buf.extend_from_slice(chunk);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }

    pub fn capacity(&self) -> usize {
        self.buf.capacity()
    }

    pub fn into_inner(self) -> Vec<u8> {
        self.buf
    }
}

/// Why reading a body stopped.
#[derive(Debug)]
pub enum ReadError {
    OverLimit(OverLimit),
    /// The connection failed mid-body.
    Transport(String),
}

/// Stream `body` into `buf`.
pub async fn read_body(
    mut body: kube::client::Body,
    mut buf: LimitedBuffer<'_>,
) -> Result<Vec<u8>, ReadError> {
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ReadError::Transport(error_chain(&e)))?;
        if let Ok(data) = frame.into_data() {
            buf.push(&data).map_err(ReadError::OverLimit)?;
        }
    }
    Ok(buf.into_inner())
}

/// An error and its sources, `: `-joined (hyper's top-level messages alone say little).
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let s = e.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        source = e.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_holds_nor_allocates_past_the_limit() {
        // (limit, declared length, chunk sizes, Ok(total) or Err(index of refused chunk))
        type Case = (usize, Option<u64>, Vec<usize>, Result<usize, usize>);
        let cases: Vec<Case> = vec![
            (10, None, vec![3, 3, 4], Ok(10)),
            (10, None, vec![3, 3, 5], Err(2)),
            (10, None, vec![11], Err(0)),
            (10, None, vec![], Ok(0)),
            (10, Some(10), vec![10], Ok(10)),
            (1000, None, vec![1; 1000], Ok(1000)),
            (1000, None, vec![7; 200], Err(142)),
            (1 << 20, None, vec![4096; 256], Ok(1 << 20)),
            (1 << 20, None, vec![4096; 300], Err(256)),
            (1 << 20, None, vec![64 * 1024; 17], Err(16)),
            // The declared length may lie, both ways.
            (100, Some(5), vec![50, 50], Ok(100)),
            (100, Some(100), vec![50, 51], Err(1)),
        ];
        for (limit, declared, chunks, want) in cases {
            let mut buf = LimitedBuffer::new(limit, declared, None).expect("declared fits");
            let mut got = Ok(0);
            for (i, size) in chunks.iter().enumerate() {
                match buf.push(&vec![b'x'; *size]) {
                    Ok(()) => {
                        assert!(buf.len() <= limit && buf.capacity() <= limit, "{limit}");
                    }
                    Err(e) => {
                        assert_eq!(
                            e,
                            OverLimit {
                                limit,
                                total: false
                            }
                        );
                        got = Err(i);
                        break;
                    }
                }
            }
            if got.is_ok() {
                got = Ok(buf.len());
            }
            assert_eq!(got, want, "{limit} {declared:?}");
        }
    }

    #[test]
    fn declared_length_over_the_limit_fails_before_reading() {
        assert_eq!(
            LimitedBuffer::new(10, Some(11), None).unwrap_err(),
            OverLimit {
                limit: 10,
                total: false
            }
        );
        // A huge declared length does not make us allocate it.
        let buf = LimitedBuffer::new(usize::MAX, Some(u64::MAX / 2), None).unwrap();
        assert!(buf.capacity() <= MAX_PREALLOCATION);
    }

    #[test]
    fn a_shared_budget_bounds_the_sum() {
        let budget = Budget::new(100);
        let mut a = LimitedBuffer::new(80, None, Some(&budget)).unwrap();
        let mut b = LimitedBuffer::new(80, None, Some(&budget)).unwrap();
        a.push(&[0; 60]).unwrap();
        b.push(&[0; 30]).unwrap();
        assert_eq!(budget.left(), 10);
        assert_eq!(
            b.push(&[0; 11]).unwrap_err(),
            OverLimit {
                limit: 100,
                total: true
            }
        );
        assert_eq!(budget.left(), 10, "a refused chunk takes nothing");
        b.push(&[0; 10]).unwrap();
        assert!(LimitedBuffer::new(80, Some(1), Some(&budget)).is_err());
        assert!(LimitedBuffer::new(80, Some(0), Some(&budget)).is_ok());
    }
}
