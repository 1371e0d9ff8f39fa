//! Classic CDR (XCDR1), the wire format of ROS 2 messages as rosbag2 stores them and as a raw
//! subscription delivers them: a 4-byte encapsulation header, then fields aligned to their own size
//! measured from the end of that header.

use super::CloudError;

const CDR_BE: [u8; 2] = [0x00, 0x00];
const CDR_LE: [u8; 2] = [0x00, 0x01];

/// Reads primitives from a CDR buffer, borrowing byte sequences instead of copying them.
pub struct CdrReader<'a> {
    buf: &'a [u8],
    pos: usize,
    little_endian: bool,
}

impl<'a> CdrReader<'a> {
    /// Parses the encapsulation header; only plain CDR (big or little endian) is accepted.
    pub fn new(bytes: &'a [u8]) -> Result<Self, CloudError> {
        if bytes.len() < 4 {
            return Err(CloudError::Truncated { what: "CDR encapsulation header", need: 4, have: bytes.len() });
        }
        let little_endian = match [bytes[0], bytes[1]] {
            CDR_LE => true,
            CDR_BE => false,
            other => return Err(CloudError::BadEncapsulation(u16::from_be_bytes(other))),
        };
        Ok(Self { buf: &bytes[4..], pos: 0, little_endian })
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], CloudError> {
        let end = self.pos.checked_add(n).ok_or(CloudError::Overflow { what })?;
        if end > self.buf.len() {
            return Err(CloudError::Truncated { what, need: end + 4, have: self.buf.len() + 4 });
        }
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    fn align(&mut self, n: usize) {
        self.pos = self.pos.div_ceil(n) * n;
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], CloudError> {
        self.align(N);
        Ok(self.take(N, what)?.try_into().expect("take returns N bytes"))
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8, CloudError> {
        Ok(self.take(1, what)?[0])
    }

    pub fn bool(&mut self, what: &'static str) -> Result<bool, CloudError> {
        Ok(self.u8(what)? != 0)
    }

    pub fn u32(&mut self, what: &'static str) -> Result<u32, CloudError> {
        let b = self.array::<4>(what)?;
        Ok(if self.little_endian { u32::from_le_bytes(b) } else { u32::from_be_bytes(b) })
    }

    pub fn i32(&mut self, what: &'static str) -> Result<i32, CloudError> {
        Ok(self.u32(what)? as i32)
    }

    pub fn string(&mut self, what: &'static str) -> Result<String, CloudError> {
        let len = self.u32(what)? as usize;
        let raw = self.take(len, what)?;
        // The length counts the terminating NUL; tolerate writers that omit it.
        let text = raw.strip_suffix(&[0]).unwrap_or(raw);
        String::from_utf8(text.to_vec()).map_err(|_| CloudError::BadString { what })
    }

    /// A `sequence<uint8>`, borrowed from the input buffer.
    pub fn byte_seq(&mut self, what: &'static str) -> Result<&'a [u8], CloudError> {
        let len = self.u32(what)? as usize;
        self.take(len, what)
    }

    /// Sequence length prefix, checked against the bytes left so that a corrupt count cannot make
    /// the caller reserve unbounded memory.
    pub fn seq_len(&mut self, what: &'static str, min_elem_bytes: usize) -> Result<usize, CloudError> {
        let len = self.u32(what)? as usize;
        let left = self.buf.len() - self.pos.min(self.buf.len());
        if len.saturating_mul(min_elem_bytes) > left {
            return Err(CloudError::Truncated { what, need: len * min_elem_bytes, have: left });
        }
        Ok(len)
    }
}

/// Writes little-endian CDR.
pub struct CdrWriter {
    buf: Vec<u8>,
}

impl Default for CdrWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl CdrWriter {
    pub fn new() -> Self {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&CDR_LE);
        buf.extend_from_slice(&[0, 0]);
        Self { buf }
    }

    fn align(&mut self, n: usize) {
        let pos = self.buf.len() - 4;
        let pad = pos.div_ceil(n) * n - pos;
        self.buf.resize(self.buf.len() + pad, 0);
    }

    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn bool(&mut self, v: bool) {
        self.buf.push(v as u8);
    }
    pub fn u32(&mut self, v: u32) {
        self.align(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i32(&mut self, v: i32) {
        self.u32(v as u32);
    }
    pub fn f32(&mut self, v: f32) {
        self.u32(v.to_bits());
    }
    pub fn f64(&mut self, v: f64) {
        self.align(8);
        self.buf.extend_from_slice(&v.to_le_bytes());
    }
    pub fn string(&mut self, s: &str) {
        self.u32(s.len() as u32 + 1);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
    }
    pub fn byte_seq(&mut self, bytes: &[u8]) {
        self.u32(bytes.len() as u32);
        self.buf.extend_from_slice(bytes);
    }
    pub fn finish(self) -> Vec<u8> {
        self.buf
    }
}
