//! Whether a role's stored SCRAM-SHA-256 verifier (`pg_authid.rolpassword`) belongs to a
//! password, so that the agent sets a declared role's password only when it differs (a drift put
//! back, a rotated Secret) instead of on every pass (each `ALTER ROLE ... PASSWORD` writes WAL
//! and a new salt).
//!
//! The verifier is `SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>` (RFC 5803), with
//! StoredKey = SHA-256(HMAC(SaltedPassword, "Client Key")) and SaltedPassword =
//! PBKDF2-HMAC-SHA-256(password, salt, iterations). PostgreSQL normalises the password with
//! SASLprep first; for ASCII passwords that changes nothing, and for others a mismatch only
//! means the password is set again.

use base64::Engine;
use ring::{digest, hmac, pbkdf2};
use std::num::NonZeroU32;

/// Most PBKDF2 iterations accepted from a verifier (PostgreSQL's default is 4096): a forged
/// verifier cannot make the agent spin.
const MAX_ITERATIONS: u32 = 1_000_000;

/// Whether `verifier` is a SCRAM-SHA-256 verifier of `password` (false for any other format,
/// such as an MD5 hash or no password at all).
pub fn verifies(verifier: &str, password: &str) -> bool {
    let Some(rest) = verifier.strip_prefix("SCRAM-SHA-256$") else { return false };
    let Some((parameters, keys)) = rest.split_once('$') else { return false };
    let Some((iterations, salt)) = parameters.split_once(':') else { return false };
    let Some((stored_key, _server_key)) = keys.split_once(':') else { return false };
    let engine = base64::engine::general_purpose::STANDARD;
    let (Ok(iterations), Ok(salt), Ok(stored_key)) =
        (iterations.parse::<u32>(), engine.decode(salt), engine.decode(stored_key))
    else {
        return false;
    };
    let Some(iterations) = NonZeroU32::new(iterations).filter(|count| count.get() <= MAX_ITERATIONS) else {
        return false;
    };
    let mut salted = [0u8; 32];
    pbkdf2::derive(pbkdf2::PBKDF2_HMAC_SHA256, iterations, &salt, password.as_bytes(), &mut salted);
    let client_key = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, &salted), b"Client Key");
    let computed = digest::digest(&digest::SHA256, client_key.as_ref());
    constant_time_equal(computed.as_ref(), &stored_key)
}

/// Equal without an early exit (the time does not tell how many leading bytes match).
fn constant_time_equal(left: &[u8], right: &[u8]) -> bool {
    left.len() == right.len() && left.iter().zip(right).fold(0u8, |difference, (a, b)| difference | (a ^ b)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Made by PostgreSQL 15: `SET password_encryption = 'scram-sha-256'; CREATE ROLE r PASSWORD 'secret';`.
    const SECRET: &str = "SCRAM-SHA-256$4096:Qidqi0vlJUytONbJY2IphA==$pRoAU6MDqrMWjGpb4iBt7VqrcmrU2XfVV44KhR6YLho=:TwxRnEB1hVmTl0sOQ5mZCXzDr8vH6ftO2vUJMwCdBiw=";

    #[test]
    fn a_verifier_matches_its_password_only() {
        assert!(verifies(SECRET, "secret"));
        assert!(!verifies(SECRET, "Secret"));
        assert!(!verifies(SECRET, ""));
    }

    #[test]
    fn other_formats_and_forged_verifiers_never_match() {
        assert!(!verifies("md5a3556571e93b0d20722ba62be61e8c2d", "secret"));
        assert!(!verifies("", "secret"));
        assert!(!verifies("SCRAM-SHA-256$0:AAAA$AAAA:AAAA", "secret"));
        assert!(!verifies("SCRAM-SHA-256$99999999:AAAA$AAAA:AAAA", "secret"));
        assert!(!verifies("SCRAM-SHA-256$4096:not base64$x:y", "secret"));
    }
}
