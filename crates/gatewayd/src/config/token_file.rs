//! gatewayd's one token-file reader (`admin_token_file`, `metrics_token_file`, `gatewayd reload
//! --token-file`): the file read here, its contents parsed by [`bch_core::token::bearer_token`].
//! Each caller names the file in its own words.

use std::path::Path;

use bch_core::token::{TokenError, bearer_token};

/// Why a token file gave no token.
#[derive(Debug)]
pub enum TokenFileError {
    /// The file cannot be read.
    Unreadable(std::io::Error),
    /// It holds nothing but whitespace.
    Empty,
}

/// The bearer token in the file at `path`, without surrounding whitespace.
pub fn read_token_file(path: &Path) -> Result<String, TokenFileError> {
    let contents = std::fs::read_to_string(path).map_err(TokenFileError::Unreadable)?;
    bearer_token(&contents).map_err(|TokenError::Empty| TokenFileError::Empty)
}
