//! The little XML S3 answers with: ListObjectsV2 results and error codes. S3's response
//! documents are flat and machine-written, so elements are found by tag, not by a full parser.

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedObject {
    /// Full key.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// `LastModified` as sent (RFC 3339).
    pub last_modified: String,
}

/// One page of ListObjectsV2.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListPage {
    /// Objects of this page.
    pub objects: Vec<ListedObject>,
    /// Token for the next page, when the listing is truncated.
    pub next_continuation_token: Option<String>,
}

/// Every text content of `<tag>…</tag>` in `document`, unescaped, in order.
fn elements<'a>(document: &'a str, tag: &str) -> Vec<&'a str> {
    let open = format!("<{tag}>");
    let close = format!("</{tag}>");
    let mut found = Vec::new();
    let mut rest = document;
    while let Some(start) = rest.find(&open) {
        let after = &rest[start + open.len()..];
        let Some(end) = after.find(&close) else { break };
        found.push(&after[..end]);
        rest = &after[end + close.len()..];
    }
    found
}

/// Replaces the five predefined entities and numeric character references.
pub fn unescape(text: &str) -> String {
    let mut output = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        output.push_str(&rest[..amp]);
        let after = &rest[amp..];
        let Some(semicolon) = after.find(';') else {
            output.push_str(after);
            return output;
        };
        let entity = &after[1..semicolon];
        let decoded = match entity {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            _ => entity
                .strip_prefix("#x")
                .map(|hex| u32::from_str_radix(hex, 16))
                .or_else(|| entity.strip_prefix('#').map(|decimal| decimal.parse::<u32>()))
                .and_then(Result::ok)
                .and_then(char::from_u32),
        };
        match decoded {
            Some(character) => output.push(character),
            None => output.push_str(&after[..=semicolon]),
        }
        rest = &after[semicolon + 1..];
    }
    output.push_str(rest);
    output
}

/// Parses a ListObjectsV2 response body.
pub fn parse_list_page(document: &str) -> ListPage {
    let objects = elements(document, "Contents")
        .into_iter()
        .filter_map(|contents| {
            let key = unescape(elements(contents, "Key").first()?);
            let size = elements(contents, "Size").first().and_then(|size| size.trim().parse().ok()).unwrap_or(0);
            let last_modified =
                elements(contents, "LastModified").first().map(|text| unescape(text)).unwrap_or_default();
            Some(ListedObject { key, size, last_modified })
        })
        .collect();
    let truncated = elements(document, "IsTruncated").first().is_some_and(|value| value.trim() == "true");
    let next_continuation_token =
        elements(document, "NextContinuationToken").first().filter(|_| truncated).map(|token| unescape(token));
    ListPage { objects, next_continuation_token }
}

/// The `<Code>` of an S3 error document, if any.
pub fn error_code(document: &str) -> Option<String> {
    elements(document, "Code").first().map(|code| unescape(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_truncated_listing() {
        let document = r#"<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>b</Name><Prefix>p/</Prefix>
<KeyCount>2</KeyCount><MaxKeys>2</MaxKeys><IsTruncated>true</IsTruncated>
<Contents><Key>p/a&amp;b</Key><LastModified>2026-11-30T22:00:00.000Z</LastModified><ETag>&quot;x&quot;</ETag><Size>12</Size></Contents>
<Contents><Key>p/c</Key><LastModified>2026-11-30T22:00:01.000Z</LastModified><Size>3</Size></Contents>
<NextContinuationToken>tok&#x2B;en</NextContinuationToken></ListBucketResult>"#;
        let page = parse_list_page(document);
        assert_eq!(
            page.objects,
            vec![
                ListedObject { key: "p/a&b".into(), size: 12, last_modified: "2026-11-30T22:00:00.000Z".into() },
                ListedObject { key: "p/c".into(), size: 3, last_modified: "2026-11-30T22:00:01.000Z".into() },
            ]
        );
        assert_eq!(page.next_continuation_token.as_deref(), Some("tok+en"));
    }

    #[test]
    fn an_untruncated_listing_has_no_next_page() {
        let page = parse_list_page("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>");
        assert_eq!(page, ListPage::default());
    }

    #[test]
    fn reads_error_codes_and_leaves_unknown_entities() {
        assert_eq!(error_code("<Error><Code>NoSuchBucket</Code></Error>").as_deref(), Some("NoSuchBucket"));
        assert_eq!(unescape("a &bogus; b & c"), "a &bogus; b & c");
    }
}
