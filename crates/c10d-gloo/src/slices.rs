//! Cutting a leased byte buffer into the per-rank or per-tensor parts an algorithm works on.

/// Splits `buf` into `n` equal parts (works for empty buffers too).
pub(crate) fn split_n(mut buf: &mut [u8], n: usize) -> Vec<&mut [u8]> {
    let each = buf.len() / n.max(1);
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let (a, b) = std::mem::take(&mut buf).split_at_mut(each);
        v.push(a);
        buf = b;
    }
    v
}

pub(crate) fn split_n_ref(mut buf: &[u8], n: usize) -> Vec<&[u8]> {
    let each = buf.len() / n.max(1);
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        let (a, b) = buf.split_at(each);
        v.push(a);
        buf = b;
    }
    v
}

/// Splits `buf` into parts of the given byte sizes.
pub(crate) fn split_sizes<'a>(mut buf: &'a mut [u8], sizes: &[usize]) -> Vec<&'a mut [u8]> {
    sizes
        .iter()
        .map(|s| {
            let (a, b) = std::mem::take(&mut buf).split_at_mut(*s);
            buf = b;
            a
        })
        .collect()
}

pub(crate) fn split_sizes_ref<'a>(mut buf: &'a [u8], sizes: &[usize]) -> Vec<&'a [u8]> {
    sizes
        .iter()
        .map(|s| {
            let (a, b) = buf.split_at(*s);
            buf = b;
            a
        })
        .collect()
}
