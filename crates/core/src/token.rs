//! Bearer tokens as token files hold them (gatewayd's `admin_token_file` and
//! `metrics_token_file`, bch-tui's `--token-file`, bch-drill's `--control-token-file`): the
//! parsing every reader shares. Reading the file is the caller's (this crate does no I/O), and so
//! is naming the file in the error.

/// Why a token file's contents are no token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// Nothing but whitespace: an empty token would open nothing, or everything.
    #[error("the file is empty")]
    Empty,
}

/// The token in `contents`: the text without surrounding whitespace (files usually end in a
/// newline, which is not part of the token). Refuses contents that are only whitespace.
pub fn bearer_token(contents: &str) -> Result<String, TokenError> {
    let token = contents.trim();
    if token.is_empty() {
        return Err(TokenError::Empty);
    }
    Ok(token.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn surrounding_whitespace_is_not_part_of_the_token() {
        assert_eq!(bearer_token("s3cret\n").unwrap(), "s3cret");
        assert_eq!(bearer_token("  a b \r\n").unwrap(), "a b");
        assert_eq!(bearer_token(" \n\t"), Err(TokenError::Empty));
        assert_eq!(bearer_token(""), Err(TokenError::Empty));
    }
}
