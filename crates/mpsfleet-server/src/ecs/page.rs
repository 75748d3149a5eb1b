//! ECS's pagination: `maxResults` (1 to 100, default 100) and an opaque `nextToken`. A token
//! names the last key of the page before (hex, so that any key survives the round trip), so a
//! page goes on after it even when objects were added or removed meanwhile.

use super::EcsError;
use crate::auth::{hex, unhex};

/// The most a List call answers at once.
pub const MAX_RESULTS: i64 = 100;

/// The page of `items` (in the order of their keys, `key`) after `next_token`, at most
/// `max_results`, and the token of the page after it.
pub fn page<T>(
    items: Vec<T>,
    key: impl Fn(&T) -> String,
    next_token: Option<&str>,
    max_results: Option<i64>,
) -> Result<(Vec<T>, Option<String>), EcsError> {
    page_in(false, items, key, next_token, max_results)
}

/// [`page`], newest key first when `descending` (ECS's `sort: DESC`).
pub fn page_in<T>(
    descending: bool,
    items: Vec<T>,
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
    let after = match next_token.filter(|t| !t.is_empty()) {
        Some(token) => Some(
            unhex(token)
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| EcsError::invalid("nextToken is not a token this API gave"))?,
        ),
        None => None,
    };
    // Each key is made once: a list may hold a pool's every task.
    let mut keyed: Vec<(String, T)> = items.into_iter().map(|i| (key(&i), i)).collect();
    if let Some(after) = &after {
        keyed.retain(|(k, _)| if descending { k < after } else { k > after });
    }
    keyed.sort_unstable_by(|a, b| if descending { b.0.cmp(&a.0) } else { a.0.cmp(&b.0) });
    let next = (keyed.len() > limit).then(|| hex(keyed[limit - 1].0.as_bytes()));
    keyed.truncate(limit);
    Ok((keyed.into_iter().map(|(_, i)| i).collect(), next))
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
        assert!(page(items.clone(), Clone::clone, Some("zz"), None).is_err());
        // Newest first, followed to the end the same way.
        let (mut seen, mut token) = (Vec::new(), None::<String>);
        loop {
            let (p, next) = page_in(true, items.clone(), Clone::clone, token.as_deref(), Some(7)).unwrap();
            seen.extend(p);
            match next {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        assert_eq!(seen, items.iter().rev().cloned().collect::<Vec<_>>());
    }
}
