//! A protobuf list response read as its bytes arrive: each item is decoded once its bytes are
//! there, so that a list of every workload is never held whole (10,000 Deployments are 27 MB).
//!
//! The response is the `k8s\0` prefix and a `runtime.Unknown` envelope whose field 2 (`raw`)
//! holds the list message: its `ListMeta` (field 1) and its items (field 2), each
//! length-delimited. The envelope's other fields (type meta before `raw`, content encoding and
//! type after) are small and read whole.

use std::collections::VecDeque;

use super::{DecodeError, ListMeta, MAGIC, ProtoObject, Result, list_meta};

/// The longest single field read whole: more than any object the API server stores (etcd's
/// default request limit is 1.5 MiB), less than what a hostile length would make us buffer.
const MAX_FIELD: usize = 64 << 20;

/// Where the reader is in the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Before the `k8s\0` prefix.
    Prefix,
    /// Among the envelope's fields; `raw_read` once its list has been read.
    Envelope { raw_read: bool },
    /// Inside the list message, with this many of its bytes still to come.
    List { left: usize },
}

/// Reads a list response chunk by chunk (see the module doc).
pub struct ListReader {
    /// Bytes received and not yet read: at most one field (an item) and the next chunk.
    pending: Vec<u8>,
    place: Place,
    meta: ListMeta,
}

impl Default for ListReader {
    fn default() -> Self {
        ListReader { pending: Vec::new(), place: Place::Prefix, meta: ListMeta::default() }
    }
}

/// A varint at the start of `buf`: its value and length, `None` when more bytes are needed.
fn varint(buf: &[u8]) -> Result<Option<(u64, usize)>> {
    let mut value = 0u64;
    for (i, byte) in buf.iter().take(10).enumerate() {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(Some((value, i + 1)));
        }
    }
    if buf.len() >= 10 { Err(DecodeError("overlong varint")) } else { Ok(None) }
}

/// A length-delimited field's header at the start of `buf`: its number, the header's length
/// and the value's; `None` when more bytes are needed.
fn header(buf: &[u8]) -> Result<Option<(u64, usize, usize)>> {
    let Some((tag, tag_len)) = varint(buf)? else { return Ok(None) };
    if tag & 7 != 2 {
        return Err(DecodeError("expected a length-delimited field"));
    }
    let Some((len, len_len)) = varint(&buf[tag_len..])? else { return Ok(None) };
    let len = usize::try_from(len).map_err(|_| DecodeError("length out of range"))?;
    Ok(Some((tag >> 3, tag_len + len_len, len)))
}

impl ListReader {
    /// Reads `chunk`, appending the items it completes to `items`.
    pub fn feed<K: ProtoObject>(&mut self, chunk: &[u8], items: &mut VecDeque<K>) -> Result<()> {
        let mut pending = std::mem::take(&mut self.pending);
        pending.extend_from_slice(chunk);
        let mut at = 0;
        let read = loop {
            match self.step(&pending[at..], items) {
                Ok(Some(n)) => at += n,
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        pending.drain(..at);
        self.pending = pending;
        read
    }

    /// Reads one thing at the start of `buf`; how many bytes, `None` when more are needed.
    fn step<K: ProtoObject>(
        &mut self,
        buf: &[u8],
        items: &mut VecDeque<K>,
    ) -> Result<Option<usize>> {
        match self.place {
            Place::Prefix if buf.len() < MAGIC.len() => Ok(None),
            Place::Prefix if buf.starts_with(MAGIC) => {
                self.place = Place::Envelope { raw_read: false };
                Ok(Some(MAGIC.len()))
            }
            Place::Prefix => Err(DecodeError("missing the k8s protobuf prefix")),
            Place::Envelope { raw_read } => {
                let Some((number, head, len)) = header(buf)? else { return Ok(None) };
                if number == 2 {
                    if raw_read {
                        return Err(DecodeError("a second list in one response"));
                    }
                    self.place = Place::List { left: len };
                    return Ok(Some(head));
                }
                let Some(value) = whole(buf, head, len)? else { return Ok(None) };
                if number == 3 && !value.is_empty() {
                    return Err(DecodeError("content encoding not supported"));
                }
                Ok(Some(head + len))
            }
            Place::List { left: 0 } => {
                self.place = Place::Envelope { raw_read: true };
                Ok(Some(0))
            }
            Place::List { left } => {
                let Some((number, head, len)) = header(buf)? else { return Ok(None) };
                let size = head.checked_add(len).filter(|&s| s <= left);
                let size = size.ok_or(DecodeError("a list field past the list's end"))?;
                let Some(value) = whole(buf, head, len)? else { return Ok(None) };
                match number {
                    1 => self.meta = list_meta(value)?,
                    2 => items.push_back(K::decode_message(value)?),
                    _ => {}
                }
                self.place = Place::List { left: left - size };
                Ok(Some(size))
            }
        }
    }

    /// The list's metadata, once the response is read; an error if it ended early.
    pub fn finish(mut self) -> Result<ListMeta> {
        if self.place == (Place::List { left: 0 }) {
            self.place = Place::Envelope { raw_read: true };
        }
        match self.place {
            Place::Envelope { raw_read: true } if self.pending.is_empty() => Ok(self.meta),
            _ => Err(DecodeError("the list ended early")),
        }
    }
}

/// The value of a field whose header is `head` bytes and value `len`, when all there.
fn whole(buf: &[u8], head: usize, len: usize) -> Result<Option<&[u8]>> {
    if len > MAX_FIELD {
        return Err(DecodeError("a field over 64 MiB"));
    }
    Ok(buf.get(head..head + len))
}
