//! The HPACK (RFC 7541) the gRPC client needs: literal fields to send, and
//! enough decoding to read an answer's trailers (`grpc-status`,
//! `grpc-message`). The client announces a dynamic table of 0 bytes, so a
//! block it reads names only the static table and literals; no entry is
//! ever kept. Huffman-coded strings are decoded.

/// A header field as read: its name and value.
pub type Field = (String, String);

/// An HPACK literal header field without indexing, new name, no Huffman.
pub fn literal(block: &mut Vec<u8>, name: &str, value: &str) {
    block.push(0);
    for s in [name, value] {
        integer(block, s.len(), 7, 0);
        block.extend_from_slice(s.as_bytes());
    }
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 5.1).
pub fn integer(block: &mut Vec<u8>, mut value: usize, n: u32, first: u8) {
    let max = (1usize << n) - 1;
    if value < max {
        block.push(first | value as u8);
        return;
    }
    block.push(first | max as u8);
    value -= max;
    while value >= 128 {
        block.push((value % 128 + 128) as u8);
        value /= 128;
    }
    block.push(value as u8);
}

/// The fields of a header block, in order (RFC 7541 6).
pub fn decode(mut block: &[u8]) -> Result<Vec<Field>, String> {
    let mut fields = Vec::new();
    while let Some(&first) = block.first() {
        if first & 0x80 != 0 {
            let (name, value) = entry(read_integer(&mut block, 7)?)?;
            fields.push((name.to_string(), value.to_string()));
        } else if first & 0xe0 == 0x20 {
            let size = read_integer(&mut block, 5)?;
            if size != 0 {
                return Err(format!("a dynamic table of {size} bytes, 0 announced"));
            }
        } else {
            // 01: with incremental indexing (evicted at once from a table
            // of 0 bytes); 0000 and 0001: without, never indexed.
            let prefix = if first & 0x40 != 0 { 6 } else { 4 };
            let name = match read_integer(&mut block, prefix)? {
                0 => string(&mut block)?,
                index => entry(index)?.0.to_string(),
            };
            fields.push((name, string(&mut block)?));
        }
    }
    Ok(fields)
}

/// An entry of the static table (RFC 7541 Appendix A); the dynamic table
/// is empty.
fn entry(index: usize) -> Result<(&'static str, &'static str), String> {
    index
        .checked_sub(1)
        .and_then(|i| STATIC.get(i))
        .copied()
        .ok_or_else(|| format!("header index {index} is outside the static table"))
}

/// An integer with an `n`-bit prefix, taken off the front of `block`.
fn read_integer(block: &mut &[u8], n: u32) -> Result<usize, String> {
    let max = (1usize << n) - 1;
    let mut next = || -> Result<u8, String> {
        let (&b, rest) = block.split_first().ok_or("a truncated header integer")?;
        *block = rest;
        Ok(b)
    };
    let mut value = next()? as usize & max;
    if value < max {
        return Ok(value);
    }
    for shift in (0..=28).step_by(7) {
        let b = next()?;
        value += ((b & 0x7f) as usize) << shift;
        if b & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err("a header integer over 2^35".into())
}

/// A string literal (raw or Huffman-coded), taken off the front of `block`.
fn string(block: &mut &[u8]) -> Result<String, String> {
    let huffman = block.first().is_some_and(|b| b & 0x80 != 0);
    let len = read_integer(block, 7)?;
    let bytes = block.get(..len).ok_or("a truncated header string")?;
    *block = &block[len..];
    let bytes = if huffman {
        unhuffman(bytes)?
    } else {
        bytes.to_vec()
    };
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Decodes the Huffman code of RFC 7541 Appendix B. The code is canonical
/// (codes of one length are consecutive, in symbol order, and each length's
/// first code follows the last of the length before), so the lengths alone
/// define it.
fn unhuffman(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let mut symbols: Vec<usize> = (0..CODE_LENGTHS.len()).collect();
    symbols.sort_by_key(|&s| (CODE_LENGTHS[s], s));
    // For each length: its first code and where its symbols start.
    let (mut first, mut start, mut count) = ([0u32; 31], [0usize; 31], [0u32; 31]);
    for &len in &CODE_LENGTHS {
        count[len as usize] += 1;
    }
    for len in 1..31 {
        first[len] = (first[len - 1] + count[len - 1]) << 1;
        start[len] = start[len - 1] + count[len - 1] as usize;
    }
    let (mut out, mut code, mut len) = (Vec::new(), 0u32, 0usize);
    for bit in bytes
        .iter()
        .flat_map(|b| (0..8).rev().map(move |i| (b >> i) & 1))
    {
        code = code << 1 | bit as u32;
        len += 1;
        if len > 30 {
            return Err("a Huffman code longer than 30 bits".into());
        }
        if code >= first[len] && code - first[len] < count[len] {
            match symbols[start[len] + (code - first[len]) as usize] {
                256 => return Err("EOS inside a Huffman string".into()),
                symbol => out.push(symbol as u8),
            }
            (code, len) = (0, 0);
        }
    }
    // What is left must be padding: under 8 bits, all ones (EOS's prefix).
    if len >= 8 || code != (1 << len) - 1 {
        return Err("a Huffman string's padding is not EOS's prefix".into());
    }
    Ok(out)
}

/// The bit length of each symbol's code, 0 to 255 and EOS (RFC 7541 B).
const CODE_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];

/// RFC 7541 Appendix A, index 1 first.
const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn fields(list: &[(&str, &str)]) -> Vec<Field> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn integers_follow_rfc_7541() {
        // C.1.1 and C.1.2 of RFC 7541, written and read back.
        let mut b = Vec::new();
        integer(&mut b, 10, 5, 0);
        assert_eq!(b, [10]);
        let mut b = Vec::new();
        integer(&mut b, 1337, 5, 0);
        assert_eq!(b, [31, 154, 10]);
        assert_eq!(read_integer(&mut &b[..], 5).unwrap(), 1337);
        assert!(read_integer(&mut &[31, 154][..], 5).is_err());
        let mut b = Vec::new();
        literal(&mut b, "te", "trailers");
        assert_eq!(b, b"\x00\x02te\x08trailers");
        assert_eq!(decode(&b).unwrap(), fields(&[("te", "trailers")]));
    }

    #[test]
    fn rfc_7541_examples_decode() {
        // C.4.1: indexed fields and a Huffman value of an indexed name.
        let block = hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff");
        let want = [
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ];
        assert_eq!(decode(&block).unwrap(), fields(&want));
        // C.6.1: a response, every string Huffman-coded.
        let block = hex(
            "4882 6402 5885 aec3 771a 4b61 96d0 7abe 9410 54d4 44a8 2005 9504 0b81 66e0 82a6
             2d1b ff6e 919d 29ad 1718 63c7 8f0b 97c8 e9ae 82ae 43d3",
        );
        let want = [
            (":status", "302"),
            ("cache-control", "private"),
            ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
            ("location", "https://www.example.com"),
        ];
        assert_eq!(decode(&block).unwrap(), fields(&want));
        // C.2.3: a never-indexed literal with a new name, raw.
        let block = hex("1008 7061 7373 776f 7264 0673 6563 7265 74");
        assert_eq!(decode(&block).unwrap(), fields(&[("password", "secret")]));
    }

    /// The canonical code the lengths define, for writing test strings.
    fn huffman(s: &[u8]) -> Vec<u8> {
        let mut symbols: Vec<usize> = (0..257).collect();
        symbols.sort_by_key(|&s| (CODE_LENGTHS[s], s));
        let mut codes = [0u32; 257];
        let (mut code, mut prev) = (0u32, CODE_LENGTHS[symbols[0]]);
        for (i, &s) in symbols.iter().enumerate() {
            if i > 0 {
                code = (code + 1) << (CODE_LENGTHS[s] - prev);
                prev = CODE_LENGTHS[s];
            }
            codes[s] = code;
        }
        let mut bits: Vec<u8> = Vec::new();
        for &b in s {
            let len = CODE_LENGTHS[b as usize];
            bits.extend((0..len).rev().map(|i| (codes[b as usize] >> i) as u8 & 1));
        }
        while !bits.len().is_multiple_of(8) {
            bits.push(1);
        }
        bits.chunks(8)
            .map(|c| c.iter().fold(0, |acc, b| acc << 1 | b))
            .collect()
    }

    #[test]
    fn every_byte_round_trips_through_the_huffman_code() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(unhuffman(&huffman(&all)).unwrap(), all);
        assert_eq!(
            huffman(b"www.example.com"),
            hex("f1e3 c2e5 f23a 6ba0 ab90 f4ff")
        );
    }

    #[test]
    fn grpc_trailers_as_go_writes_them_decode() {
        // Go's hpack encoder with the table limited to 0: a size update,
        // then literals without indexing, Huffman-coded where shorter.
        let mut block = vec![0x20];
        for (name, value) in [("grpc-status", "5"), ("grpc-message", "not found")] {
            block.push(0);
            for (s, coded) in [
                (name, huffman(name.as_bytes())),
                (value, huffman(value.as_bytes())),
            ] {
                if coded.len() < s.len() {
                    integer(&mut block, coded.len(), 7, 0x80);
                    block.extend_from_slice(&coded);
                } else {
                    integer(&mut block, s.len(), 7, 0);
                    block.extend_from_slice(s.as_bytes());
                }
            }
        }
        let want = [("grpc-status", "5"), ("grpc-message", "not found")];
        assert_eq!(decode(&block).unwrap(), fields(&want));
    }

    #[test]
    fn bad_blocks_are_refused() {
        // An index past the static table (a dynamic entry was never allowed).
        assert!(decode(&[0x80 | 62]).is_err());
        assert!(decode(&[0x80]).is_err());
        // A dynamic table size other than 0.
        assert!(decode(&hex("3f e1 1f")).is_err());
        // A truncated string, a padding of 8 bits, a padding not all ones.
        assert!(decode(&hex("00 05 61")).is_err());
        assert!(unhuffman(&[0xff]).is_err());
        assert!(unhuffman(&[0x00]).is_err());
    }
}
