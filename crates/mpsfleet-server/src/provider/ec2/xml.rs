//! The XML of EC2's answers: a small reader (elements, text, entities, CDATA) and the
//! instances and errors read from it.

use super::*;

/// One EC2 instance as DescribeInstances, RunInstances or TerminateInstances answer it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ec2Instance {
    pub id: String,
    /// EC2's state name: `pending`, `running`, `shutting-down`, `terminated`, `stopping`,
    /// `stopped`.
    pub state: String,
    pub tags: BTreeMap<String, String>,
    /// EC2's reason for the last state change, when it gives one.
    pub state_reason: String,
}

impl Ec2Instance {
    /// The provider's state for the instance.
    pub fn host_state(&self) -> ProviderHostState {
        let reason =
            if self.state_reason.is_empty() { String::new() } else { format!(": {}", self.state_reason) };
        let detail = format!("EC2 instance {} is {}{reason}", self.id, self.state);
        match self.state.as_str() {
            "pending" => ProviderHostState::Pending,
            "running" => ProviderHostState::Running,
            "shutting-down" | "stopping" => ProviderHostState::Terminating,
            "terminated" | "stopped" => ProviderHostState::Terminated { detail },
            _ => ProviderHostState::Unknown { detail },
        }
    }

    /// Lower is more alive: the instance describe answers for when several have the tags.
    pub(super) fn rank(&self) -> u8 {
        match self.state.as_str() {
            "running" => 0,
            "pending" => 1,
            "stopping" | "shutting-down" => 2,
            "stopped" => 3,
            "terminated" => 5,
            _ => 4,
        }
    }
}

/// The instances of an answer: `reservationSet/item/instancesSet/item` (DescribeInstances) or
/// `instancesSet/item` (RunInstances, TerminateInstances, whose state is `currentState`).
pub fn parse_instances(answer: &XmlElement) -> Vec<Ec2Instance> {
    let reserved = answer.items("reservationSet").flat_map(|r| r.items("instancesSet"));
    reserved
        .chain(answer.items("instancesSet"))
        .filter_map(|item| {
            let id = item.text_at(&["instanceId"])?.to_string();
            let state = item
                .text_at(&["instanceState", "name"])
                .or_else(|| item.text_at(&["currentState", "name"]))
                .unwrap_or_default()
                .to_string();
            let tags = item
                .items("tagSet")
                .filter_map(|t| {
                    Some((t.text_at(&["key"])?.to_string(), t.text_at(&["value"]).unwrap_or("").to_string()))
                })
                .collect();
            let state_reason = item
                .text_at(&["stateReason", "message"])
                .filter(|m| !m.is_empty())
                .or_else(|| item.text_at(&["reason"]))
                .unwrap_or_default()
                .to_string();
            Some(Ec2Instance { id, state, tags, state_reason })
        })
        .collect()
}

/// The error of an EC2 error answer (`<Response><Errors><Error><Code>…`): code, message and
/// request id.
pub fn parse_error(answer: &XmlElement) -> Option<(String, String, String)> {
    let error = answer.find("Error").filter(|e| e.child("Code").is_some())?;
    let code = error.text_at(&["Code"]).unwrap_or_default().to_string();
    let message = error.text_at(&["Message"]).unwrap_or_default().to_string();
    let request_id = answer
        .find("RequestID")
        .or_else(|| answer.find("RequestId"))
        .map(|r| r.text().to_string())
        .unwrap_or_default();
    Some((code, message, request_id))
}

/// One element of an XML document: its local name (a namespace prefix dropped), its text
/// (entities decoded, CDATA included), and its child elements in order. Attributes are not
/// kept: EC2's answers carry none that matter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct XmlElement {
    pub name: String,
    pub text: String,
    pub children: Vec<XmlElement>,
}

impl XmlElement {
    /// The text, trimmed.
    pub fn text(&self) -> &str {
        self.text.trim()
    }

    /// The first child element named `name`.
    pub fn child(&self, name: &str) -> Option<&XmlElement> {
        self.children.iter().find(|c| c.name == name)
    }

    /// Every child element named `name`.
    pub fn children<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a XmlElement> + 'a {
        self.children.iter().filter(move |c| c.name == name)
    }

    /// The `item` elements of the child list `set` (`<tagSet><item>…</item></tagSet>`).
    pub fn items<'a>(&'a self, set: &'a str) -> impl Iterator<Item = &'a XmlElement> + 'a {
        self.child(set).into_iter().flat_map(|s| s.children("item"))
    }

    /// The element down `path` of child names.
    pub fn path(&self, path: &[&str]) -> Option<&XmlElement> {
        path.iter().try_fold(self, |el, name| el.child(name))
    }

    /// The trimmed text of the element down `path`.
    pub fn text_at(&self, path: &[&str]) -> Option<&str> {
        self.path(path).map(XmlElement::text)
    }

    /// The first element named `name` in document order, this one included.
    pub fn find(&self, name: &str) -> Option<&XmlElement> {
        if self.name == name {
            return Some(self);
        }
        self.children.iter().find_map(|c| c.find(name))
    }
}

/// Elements nested deeper are refused.
pub(super) const MAX_XML_DEPTH: usize = 64;

/// Parses an XML document into its root element. What EC2 sends is read: the declaration,
/// comments, processing instructions, elements with attributes (skipped), text with the five
/// predefined entities and character references, CDATA. A document type declaration, an
/// unknown entity, a mismatched or unclosed tag, or text outside the root is an error.
pub fn parse_xml(input: &str) -> Result<XmlElement, String> {
    let mut stack: Vec<XmlElement> = Vec::new();
    let mut root: Option<XmlElement> = None;
    let mut rest = input.strip_prefix('\u{feff}').unwrap_or(input);
    // Attaches a finished element to its parent, or makes it the root.
    pub(super) fn attach(
        stack: &mut [XmlElement],
        root: &mut Option<XmlElement>,
        el: XmlElement,
    ) -> Result<(), String> {
        match stack.last_mut() {
            Some(parent) => parent.children.push(el),
            None if root.is_none() => *root = Some(el),
            None => return Err(format!("a second root element <{}>", el.name)),
        }
        Ok(())
    }
    let local = |name: &str| name.rsplit(':').next().unwrap_or(name).to_string();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("<?") {
            let end = after.find("?>").ok_or("an unterminated processing instruction")?;
            rest = &after[end + 2..];
        } else if let Some(after) = rest.strip_prefix("<!--") {
            let end = after.find("-->").ok_or("an unterminated comment")?;
            rest = &after[end + 3..];
        } else if let Some(after) = rest.strip_prefix("<![CDATA[") {
            let end = after.find("]]>").ok_or("an unterminated CDATA section")?;
            stack.last_mut().ok_or("CDATA outside the root element")?.text.push_str(&after[..end]);
            rest = &after[end + 3..];
        } else if rest.starts_with("<!") {
            return Err("a document type declaration (not accepted)".into());
        } else if let Some(after) = rest.strip_prefix("</") {
            let end = after.find('>').ok_or("an unterminated end tag")?;
            let name = after[..end].trim();
            let el = stack.pop().ok_or_else(|| format!("an end tag </{name}> without its start tag"))?;
            if local(name) != el.name {
                return Err(format!("an end tag </{name}> closing <{}>", el.name));
            }
            attach(&mut stack, &mut root, el)?;
            rest = &after[end + 1..];
        } else if let Some(after) = rest.strip_prefix('<') {
            let end = tag_end(after).ok_or("an unterminated start tag")?;
            let (inner, empty) = match after[..end].strip_suffix('/') {
                Some(inner) => (inner, true),
                None => (&after[..end], false),
            };
            let name = inner.split(|c: char| c.is_ascii_whitespace()).next().unwrap_or_default();
            let name_ok = |c: char| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | ':');
            if name.is_empty() || !name.chars().all(name_ok) {
                return Err(format!("a start tag with a bad name {name:?}"));
            }
            if root.is_some() {
                return Err(format!("an element <{name}> after the root element"));
            }
            let el = XmlElement { name: local(name), ..XmlElement::default() };
            if empty {
                attach(&mut stack, &mut root, el)?;
            } else if stack.len() >= MAX_XML_DEPTH {
                return Err(format!("elements nested more than {MAX_XML_DEPTH} deep"));
            } else {
                stack.push(el);
            }
            rest = &after[end + 1..];
        } else {
            let end = rest.find('<').unwrap_or(rest.len());
            let text = &rest[..end];
            match stack.last_mut() {
                Some(top) => top.text.push_str(&decode_entities(text)?),
                None if text.trim().is_empty() => {}
                None => return Err("text outside the root element".into()),
            }
            rest = &rest[end..];
        }
    }
    if let Some(open) = stack.last() {
        return Err(format!("<{}> is not closed", open.name));
    }
    root.ok_or_else(|| "no element".to_string())
}

/// Where a start tag's `>` is, outside quoted attribute values.
pub(super) fn tag_end(s: &str) -> Option<usize> {
    let mut quote = None;
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (None, '>') => return Some(i),
            (None, '"' | '\'') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            _ => {}
        }
    }
    None
}

pub(super) fn decode_entities(text: &str) -> Result<String, String> {
    if !text.contains('&') {
        return Ok(text.to_string());
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find('&') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let end = after.find(';').filter(|&e| e <= 10).ok_or("an '&' that starts no entity")?;
        let entity = &after[..end];
        let c = match entity {
            "lt" => '<',
            "gt" => '>',
            "amp" => '&',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = if let Some(hex) = entity.strip_prefix("#x").or_else(|| entity.strip_prefix("#X"))
                {
                    u32::from_str_radix(hex, 16).ok()
                } else if let Some(dec) = entity.strip_prefix('#') {
                    dec.parse().ok()
                } else {
                    return Err(format!("an unknown entity &{entity};"));
                };
                code.and_then(char::from_u32)
                    .ok_or_else(|| format!("a bad character reference &{entity};"))?
            }
        };
        out.push(c);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}
