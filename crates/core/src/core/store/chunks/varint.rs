//! The integers a chunk is made of: LEB128 varints of zigzagged changes, so a small change in
//! either direction takes a byte or two.

pub fn zigzag(v: i64) -> u128 {
    u128::from(((v << 1) ^ (v >> 63)) as u64)
}

pub fn unzigzag(v: u128) -> i64 {
    let v = v as u64;
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// A change of a byte count. PyTorch's caching allocator rounds every block to 512 bytes and
/// NVML counts memory in pages, so byte counts and their changes are nearly always multiples
/// of 512: those are stored in units of 512, 9 bits (about a byte) shorter, and the low bit
/// says which. Any other change is stored as it is, exactly.
pub fn delta(d: i64) -> u128 {
    if d % 512 == 0 {
        zigzag(d / 512) << 1
    } else {
        zigzag(d) << 1 | 1
    }
}

pub fn undelta(t: u128) -> i64 {
    let d = unzigzag(t >> 1);
    if t & 1 == 0 {
        d.wrapping_mul(512)
    } else {
        d
    }
}

/// LEB128, wide enough for a delta and its unit bit.
pub fn put(out: &mut Vec<u8>, mut v: u128) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads what `put` wrote. The bytes are only ever this module's own, so a truncated varint
/// cannot occur; it would read as the bits present.
pub fn get(bytes: &[u8], at: &mut usize) -> u128 {
    let mut v = 0u128;
    let mut shift = 0;
    while let Some(b) = bytes.get(*at) {
        *at += 1;
        if shift < 128 {
            v |= u128::from(b & 0x7f) << shift;
        }
        shift += 7;
        if b & 0x80 == 0 {
            break;
        }
    }
    v
}

/// A byte count's change from `prev` to `v`, wrapping (any `u64` round-trips).
pub fn put_change(out: &mut Vec<u8>, prev: u64, v: u64) {
    put(out, delta(v.wrapping_sub(prev) as i64));
}

pub fn get_change(bytes: &[u8], at: &mut usize, prev: u64) -> u64 {
    prev.wrapping_add(undelta(get(bytes, at)) as u64)
}

#[cfg(test)]
mod tests;
