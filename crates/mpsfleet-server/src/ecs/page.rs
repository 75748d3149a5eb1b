//! ECS's pagination: `maxResults` (1 to 100, default 100) and an opaque `nextToken`. A token
//! names the last key of the page before (hex, so that any key survives the round trip), so a
//! page goes on after it even when objects were added or removed meanwhile.

use super::EcsError;
use crate::auth::{hex, unhex};

/// The most a List call answers at once.
pub const MAX_RESULTS: i64 = 100;

/// The page of `items` (in key order, by `key`) after `next_token`, at most `max_results`, and
/// the token of the page after it.
pub fn page<T>(
    mut items: Vec<T>,
    key: impl Fn(&T) -> String,
    next_token: Option<&str>,
    max_results: Option<i64>,
) -> Result<(Vec<T>, Option<String>), EcsError> {
    let limit = match max_results {
        None => MAX_RESULTS as usize,
        Some(n) if (1..=MAX_RESULTS).contains(&n) => n as usize,
        Some(n) => {
            return Err(EcsError::invalid(format!("maxResults must be from 1 to {MAX_RESULTS}, got {n}")))
        }
    };
    items.sort_by_key(|i| key(i));
    if let Some(token) = next_token.filter(|t| !t.is_empty()) {
        let after = unhex(token)
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| EcsError::invalid("nextToken is not a token this API gave"))?;
        items.retain(|i| key(i) > after);
    }
    let next = (items.len() > limit).then(|| hex(key(&items[limit - 1]).as_bytes()));
    items.truncate(limit);
    Ok((items, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_follow_their_tokens_to_the_end_and_refuse_bad_ones() {
        let items: Vec<String> = (0..25).map(|i| format!("k{i:02}")).collect();
        let (mut seen, mut token) = (Vec::new(), None::<String>);
        loop {
            let (p, next) = page(items.clone(), Clone::clone, token.as_deref(), Some(10)).unwrap();
            seen.extend(p);
            match next {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        assert_eq!(seen, items);
        assert!(page(items.clone(), Clone::clone, None, Some(0)).is_err());
        assert!(page(items.clone(), Clone::clone, None, Some(101)).is_err());
        assert!(page(items, Clone::clone, Some("zz"), None).is_err());
    }
}
