//! Admission of image references (`spec.image`, `spec.pooler.image`): the OCI reference grammar,
//! lengths, and a pinned version (a tag other than `latest`, or a digest).

use crate::admission::field_error::FieldError;
use std::sync::LazyLock;

/// Longest `spec.image` accepted: a 255-character repository name, a 128-character tag and a
/// sha512 digest fit.
pub const MAX_IMAGE_LENGTH: usize = 512;
/// Longest repository name, registry included (distribution/reference NameTotalLengthMax).
pub const MAX_IMAGE_NAME_LENGTH: usize = 255;
/// The OCI / distribution reference grammar (github.com/distribution/reference, regexp.go),
/// anchored: capture 1 is the name, 2 the tag, 3 the digest. The repository path is lowercase;
/// only the registry host may have uppercase letters.
const IMAGE_PATTERN: &str = concat!(
    // name: optional registry host (domain or [IPv6]) with optional port, then the path
    r"^((?:(?:(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])(?:\.(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]))*",
    r"|\[[a-fA-F0-9:]+\])(?::[0-9]+)?/)?",
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*)",
    // tag
    r"(?::([A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?",
    // digest
    r"(@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$",
);

static IMAGE_REGEX: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(IMAGE_PATTERN).expect("image pattern compiles"));

/// A value as quoted in a message: long values are cut (see the validation module's own).
fn shown(value: &str) -> String {
    const SHOWN: usize = 64;
    match value.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}... ({} bytes)", &value[..cut], value.len()),
        None => value.to_string(),
    }
}

/// Checks an image reference at `path`: explicit tag or digest, a well-formed repository.
pub fn validate_image_at(path: &str, image: &str, errors: &mut Vec<FieldError>) {
    if image.len() > MAX_IMAGE_LENGTH {
        errors.push(FieldError::invalid(path, shown(image), format!("must be at most {MAX_IMAGE_LENGTH} characters")));
        return;
    }
    let Some(captures) = IMAGE_REGEX.captures(image) else {
        errors.push(FieldError::invalid(
            path,
            shown(image),
            "must be an image reference: [registry[:port]/]repository[:tag][@digest], the repository in lowercase letters, digits and separators (. _ __ -), the tag at most 128 word characters, '.' or '-'",
        ));
        return;
    };
    let name = captures.get(1).map_or("", |name| name.as_str());
    if name.len() > MAX_IMAGE_NAME_LENGTH {
        errors.push(FieldError::invalid(
            path,
            shown(image),
            format!("repository name must be at most {MAX_IMAGE_NAME_LENGTH} characters"),
        ));
        return;
    }
    // A digest pins the image whatever the tag says.
    let has_digest = captures.get(3).is_some();
    let tag = captures.get(2).map(|tag| tag.as_str());
    if !has_digest && matches!(tag, None | Some("latest")) {
        errors.push(FieldError::invalid(
            path,
            image,
            "must name an explicit tag or digest other than \"latest\", so that every instance runs the same version",
        ));
    }
}
