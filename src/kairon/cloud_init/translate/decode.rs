//! `write_files` content decoding as cloud-init does it: Python's `base64.b64decode` (lenient:
//! characters outside the alphabet are skipped, padding is required) and `gzip` (every member,
//! zero padding after the last one, CRC and length checked), with the output bounded so that
//! a small payload cannot decompress into memory without end.
//!
//! The base64 reading is our own: no crate reads it as leniently as Python does (characters
//! outside the alphabet skipped, the quirks after padding); gzip is `flate2`'s.

/// Why content could not be decoded. Never carries any of the content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DecodeError {
    /// `base64` of text with characters outside ASCII (Python refuses them).
    NotAscii,
    /// Incomplete base64 (missing padding, or one character too many).
    Base64,
    /// Not a gzip stream, or a corrupt one.
    Gzip,
    /// The decompressed output would pass the limit.
    TooLarge,
}

/// Python's non-strict `base64.b64decode` of a str.
pub(super) fn base64(text: &str) -> Result<Vec<u8>, DecodeError> {
    if !text.is_ascii() {
        return Err(DecodeError::NotAscii);
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut quad_pos, mut left, mut pads) = (0u8, 0u8, 0u8);
    for &byte in text.as_bytes() {
        if byte == b'=' {
            // Padding ends the input once it completes a quad; elsewhere it is skipped.
            if quad_pos >= 2 {
                pads += 1;
                if quad_pos + pads >= 4 {
                    return Ok(out);
                }
            }
            continue;
        }
        let Some(value) = base64_value(byte) else {
            continue;
        };
        pads = 0;
        match quad_pos {
            0 => left = value,
            1 => {
                out.push((left << 2) | (value >> 4));
                left = value & 0x0f;
            }
            2 => {
                out.push((left << 4) | (value >> 2));
                left = value & 0x03;
            }
            _ => out.push((left << 6) | value),
        }
        quad_pos = (quad_pos + 1) % 4;
    }
    if quad_pos == 0 {
        Ok(out)
    } else {
        Err(DecodeError::Base64)
    }
}

fn base64_value(byte: u8) -> Option<u8> {
    match byte {
        b'A'..=b'Z' => Some(byte - b'A'),
        b'a'..=b'z' => Some(byte - b'a' + 26),
        b'0'..=b'9' => Some(byte - b'0' + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// The decompressed content of gzip data, as Python's `gzip` reads it: every member in turn,
/// zero bytes after the last one skipped; anything else after one is an error, and no member
/// at all is empty content. At most `limit` bytes are produced: reading stops there, so a
/// small payload cannot decompress into memory without end.
pub(super) fn gunzip(data: &[u8], limit: usize) -> Result<Vec<u8>, DecodeError> {
    use std::io::Read;
    let mut out = Vec::new();
    let mut rest = data;
    while !rest.iter().all(|&b| b == 0) {
        let mut member = flate2::bufread::GzDecoder::new(rest);
        let budget = (limit - out.len()) as u64 + 1;
        (&mut member)
            .take(budget)
            .read_to_end(&mut out)
            .map_err(|_| DecodeError::Gzip)?;
        if out.len() > limit {
            return Err(DecodeError::TooLarge);
        }
        // The member, its trailer included, is read: what follows is the next one.
        rest = member.into_inner();
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_reads_as_python_does() {
        let cases: &[(&str, Result<&[u8], DecodeError>)] = &[
            ("aGVsbG8=", Ok(b"hello")),
            ("aGVs\nbG8=\n", Ok(b"hello")),
            ("  aGVsbG8h  ", Ok(b"hello!")),
            ("aGV*sbG8h", Ok(b"hello!")),
            ("aGVsbG8=trailing is ignored", Ok(b"hello")),
            ("YQ=x=Y", Ok(b"a\x0c")),
            ("", Ok(b"")),
            ("aGVsbG8", Err(DecodeError::Base64)),
            ("aGVsbG8h/", Err(DecodeError::Base64)),
            ("aGVsbG8=é", Err(DecodeError::NotAscii)),
        ];
        for (input, want) in cases {
            assert_eq!(base64(input).as_deref(), want.as_deref(), "{input:?}");
        }
    }

    /// `printf 'hello\n' | gzip -n | base64`: a fixed-Huffman member.
    const HELLO_GZ: &str = "H4sIAAAAAAAAA8tIzcnJ5wIAIDA6NgYAAAA=";

    #[test]
    fn gunzip_reads_members_and_refuses_corruption() {
        let member = base64(HELLO_GZ).unwrap();
        assert_eq!(gunzip(&member, 100).unwrap(), b"hello\n");
        let mut two = member.clone();
        two.extend_from_slice(&member);
        two.extend_from_slice(&[0, 0, 0]);
        assert_eq!(
            gunzip(&two, 100).unwrap(),
            b"hello\nhello\n",
            "members and zero padding"
        );
        assert_eq!(gunzip(&[], 100).unwrap(), b"", "no member is empty content");
        let mut garbage = member.clone();
        garbage.push(b'x');
        assert_eq!(gunzip(&garbage, 100), Err(DecodeError::Gzip), "trailing garbage");
        let mut bad_crc = member.clone();
        let n = bad_crc.len();
        bad_crc[n - 8] ^= 1;
        assert_eq!(gunzip(&bad_crc, 100), Err(DecodeError::Gzip), "crc");
        assert_eq!(gunzip(&member[..n - 3], 100), Err(DecodeError::Gzip), "truncated");
        assert_eq!(gunzip(b"plain text", 100), Err(DecodeError::Gzip), "not gzip");
        assert_eq!(gunzip(&member, 5), Err(DecodeError::TooLarge), "bounded");
    }
}
