//! Core metadata (the `METADATA` file of a wheel, or its PEP 658 `.metadata` copy on an index):
//! only its header section, read as untrusted text.

use std::io::{BufRead, BufReader, Cursor, Read};
use thiserror::Error;

/// Largest header section of a `METADATA` read (bytes). The headers of real wheels are a few
/// KiB (the long description comes after them and is not read); the file itself is compressed
/// in a wheel and could otherwise inflate to gigabytes in the front.
pub const MAX_METADATA_HEADER_BYTES: usize = 1 << 20;

/// Why a wheel's metadata could not be read.
#[derive(Debug, Error)]
pub enum MetadataError {
    /// The wheel is not a zip archive that can be read.
    #[error("not a valid wheel")]
    NotAWheel(#[source] zip::result::ZipError),
    /// No `*.dist-info/METADATA` at the top of the archive.
    #[error("the wheel has no .dist-info/METADATA")]
    Missing,
    /// Reading (and inflating) `METADATA` failed.
    #[error("cannot read METADATA")]
    Read(#[source] std::io::Error),
    /// The header section is over `limit` bytes ([`MAX_METADATA_HEADER_BYTES`]).
    #[error("the METADATA headers are longer than {limit} bytes")]
    TooLong { limit: usize },
    /// The header section is not UTF-8.
    #[error("METADATA is not UTF-8 text")]
    NotUtf8(#[source] std::str::Utf8Error),
}

/// The fields of core metadata the resolver uses (names as in the core metadata
/// specification).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CoreMetadata {
    /// `Requires-Dist` values: PEP 508 requirements, unparsed (each is bounded by
    /// [`super::bounds::check_requirement`] where it is parsed).
    pub requires_dist: Vec<String>,
    /// `Requires-Python`, if given.
    pub requires_python: Option<String>,
}

impl CoreMetadata {
    /// Reads the fields from a header section (see [`read_headers`]).
    pub fn parse(headers: &str) -> Self {
        let mut meta = CoreMetadata::default();
        for line in headers.lines() {
            let Some((key, value)) = line.split_once(':') else {
                continue;
            };
            // Header names are case-insensitive (RFC 822, which core metadata follows).
            if key.eq_ignore_ascii_case("Requires-Dist") {
                meta.requires_dist.push(value.trim().to_owned());
            } else if key.eq_ignore_ascii_case("Requires-Python") {
                meta.requires_python = Some(value.trim().to_owned());
            }
        }
        meta
    }
}

/// The header section of a `METADATA` text (up to the first blank line, or the end), at most
/// [`MAX_METADATA_HEADER_BYTES`] of it.
///
/// Errors: reading fails, the headers are longer than the limit or not UTF-8.
pub fn read_headers(reader: impl Read) -> Result<String, MetadataError> {
    // One byte past the limit, so that a header section that fills it is told from one that
    // ends exactly there; no line read can be longer than that.
    let mut reader = BufReader::new(reader.take(MAX_METADATA_HEADER_BYTES as u64 + 1));
    let mut headers: Vec<u8> = Vec::new();
    let mut line: Vec<u8> = Vec::new();
    loop {
        line.clear();
        let read = reader
            .read_until(b'\n', &mut line)
            .map_err(MetadataError::Read)?;
        // Headers end at the first blank line (or with the file); the body is the long
        // description.
        if read == 0 || line == b"\n" || line == b"\r\n" {
            break;
        }
        if headers.len() + line.len() > MAX_METADATA_HEADER_BYTES {
            return Err(MetadataError::TooLong {
                limit: MAX_METADATA_HEADER_BYTES,
            });
        }
        headers.extend_from_slice(&line);
    }
    String::from_utf8(headers).map_err(|e| MetadataError::NotUtf8(e.utf8_error()))
}

/// The header section of the wheel's `*.dist-info/METADATA` (see [`read_headers`]).
///
/// Errors: the wheel is not a readable zip, has no `METADATA`, or its headers are unreadable.
pub fn wheel_headers(wheel: &[u8]) -> Result<String, MetadataError> {
    let mut archive = zip::ZipArchive::new(Cursor::new(wheel)).map_err(MetadataError::NotAWheel)?;
    let name = archive
        .file_names()
        .find(|n| n.ends_with(".dist-info/METADATA") && n.matches('/').count() == 1)
        .map(str::to_owned)
        .ok_or(MetadataError::Missing)?;
    let entry = archive.by_name(&name).map_err(MetadataError::NotAWheel)?;
    read_headers(entry)
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// A wheel (zip) holding `pkg-1.0.dist-info/METADATA` with `metadata` as its text.
    pub fn wheel_with_metadata(metadata: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut zip = zip::ZipWriter::new(Cursor::new(Vec::new()));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file("pkg-1.0.dist-info/METADATA", options)
            .expect("start METADATA");
        zip.write_all(metadata).expect("write METADATA");
        zip.finish().expect("finish the zip").into_inner()
    }

    #[test]
    fn reads_the_headers_only() {
        let metadata = b"Metadata-Version: 2.1\r\nName: pkg\r\nRequires-Python: >=3.8\r\nRequires-Dist: attrs>=22\r\nrequires-dist: tomli; python_version < \"3.11\"\r\n\r\nRequires-Dist: not-a-header\r\n\xff\xfe body need not be UTF-8\n";
        let headers = wheel_headers(&wheel_with_metadata(metadata)).expect("headers");
        assert_eq!(
            CoreMetadata::parse(&headers),
            CoreMetadata {
                requires_dist: vec![
                    "attrs>=22".to_owned(),
                    "tomli; python_version < \"3.11\"".to_owned()
                ],
                requires_python: Some(">=3.8".to_owned()),
            }
        );
    }

    #[test]
    fn huge_headers_are_refused() {
        // Compresses to a few KiB, inflates past the limit: the front reads no more than it.
        let mut metadata = b"Name: pkg\n".to_vec();
        let line =
            b"X-Padding: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n";
        while metadata.len() <= MAX_METADATA_HEADER_BYTES {
            metadata.extend_from_slice(line);
        }
        let err = wheel_headers(&wheel_with_metadata(&metadata)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the METADATA headers are longer than 1048576 bytes"
        );
        // One endless line is cut the same way.
        let endless = vec![b'a'; 2 * MAX_METADATA_HEADER_BYTES];
        assert!(wheel_headers(&wheel_with_metadata(&endless)).is_err());
        assert!(matches!(
            wheel_headers(b"not a zip"),
            Err(MetadataError::NotAWheel(_))
        ));
    }
}
