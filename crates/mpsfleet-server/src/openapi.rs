//! The OpenAPI 3.1 document of the whole `/v1` API, served at `GET /v1/openapi.json`.
//!
//! It is generated from the code: each handler in `api.rs` carries its `#[utoipa::path]`
//! (method, path, parameters, body, answer), each type its derived schema, and
//! [`crate::api::ApiPaths`] lists the handlers next to the router. A route the router serves
//! that the document does not describe, or the other way round, fails
//! `every_route_of_the_router_is_in_the_document` below; `scripts/fuzz-api.sh` validates the
//! document and fuzzes the server against it.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, RefOr};
use utoipa::OpenApi as _;

/// The error answers any route may give, each with the JSON error body.
pub struct Errors;

/// Every error status the API answers with (see `error.rs`), and what it means.
const ERROR_STATUSES: &[(&str, &str)] = &[
    ("400", "Invalid: the body, a parameter or a field (named in `field`) is not what the route takes."),
    ("401", "No token, or one the server does not know (or one expired or revoked)."),
    ("403", "The token's role (or kind) may not call this route."),
    ("404", "No such object."),
    ("408", "The request's body did not arrive within the body timeout."),
    ("409", "The object exists already, or its state does not allow the call."),
    ("413", "The body is over the route's limit."),
    ("429", "Over the token's rate: try again after Retry-After seconds."),
    ("500", "The server failed; nothing was changed."),
    ("502", "An agent the server had to ask did not answer."),
    ("503", "The state store is unavailable; nothing was changed."),
];

impl utoipa::IntoResponses for Errors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        ERROR_STATUSES
            .iter()
            .map(|(status, meaning)| {
                let content = ContentBuilder::new().schema(Some(Ref::from_schema_name("ErrorBody"))).build();
                let response =
                    ResponseBuilder::new().description(*meaning).content("application/json", content).build();
                (status.to_string(), RefOr::T(response))
            })
            .collect()
    }
}

/// Declares the bearer token scheme every route but the public ones requires.
pub(crate) struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut Document) {
        let components = doc.components.get_or_insert_with(Default::default);
        let scheme = HttpBuilder::new()
            .scheme(HttpAuthScheme::Bearer)
            .description(Some(
                "An API token (`mpsfleet token create`), the admin token, or, for the agent \
                 routes, a host credential (register: a join, launch or replacement token).",
            ))
            .build();
        components.add_security_scheme("bearer", SecurityScheme::Http(scheme));
    }
}

/// The document, built once.
pub fn document() -> &'static Document {
    static DOC: OnceLock<Document> = OnceLock::new();
    DOC.get_or_init(crate::api::ApiPaths::openapi)
}

/// The document as JSON, built once.
pub fn document_json() -> &'static str {
    static JSON: OnceLock<String> = OnceLock::new();
    JSON.get_or_init(|| {
        serde_json::to_string(document()).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// `(METHOD, path)` of every route `api::router` serves, read from its source (a wildcard
    /// `{*name}` is the document's `{name}`).
    fn router_routes() -> BTreeSet<(String, String)> {
        let source = include_str!("api.rs");
        let router = &source[source.find("pub fn router").expect("the router")..];
        let router = &router[..router.find(".fallback(").expect("its end")];
        // Without whitespace, a call rustfmt split over lines reads as one.
        let router: String = router.split_whitespace().collect();
        let mut routes = BTreeSet::new();
        for part in router.split(".route(\"").skip(1) {
            let path = part[..part.find('"').unwrap()].replace("{*", "{");
            let handlers = &part[part.find('"').unwrap()..];
            for method in ["get", "post", "patch", "delete", "put"] {
                let call = format!("{method}(");
                if [",", ".", "::", "("].iter().any(|before| handlers.contains(&format!("{before}{call}"))) {
                    routes.insert((method.to_uppercase(), path.clone()));
                }
            }
        }
        routes
    }

    fn document_routes() -> BTreeSet<(String, String)> {
        let doc = serde_json::to_value(document()).unwrap();
        let mut routes = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().unwrap().keys() {
                routes.insert((method.to_uppercase(), path.clone()));
            }
        }
        routes
    }

    #[test]
    fn every_route_of_the_router_is_in_the_document() {
        let (router, doc) = (router_routes(), document_routes());
        assert!(router.len() >= 40, "{router:?}");
        let undocumented: Vec<_> = router.difference(&doc).collect();
        let unserved: Vec<_> = doc.difference(&router).collect();
        assert!(undocumented.is_empty(), "routes missing from the OpenAPI document: {undocumented:?}");
        assert!(unserved.is_empty(), "documented routes the router does not serve: {unserved:?}");
    }

    #[test]
    fn the_document_is_openapi_3_1_with_every_schema_it_refers_to() {
        let doc = serde_json::to_value(document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let schemas = doc["components"]["schemas"].as_object().expect("schemas");
        let text = document_json();
        let mut missing = BTreeSet::new();
        for part in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
            let name = &part[..part.find('"').unwrap()];
            if !schemas.contains_key(name) {
                missing.insert(name.to_string());
            }
        }
        assert!(missing.is_empty(), "referred to but not defined: {missing:?}");
        // Public routes need no token; every other one does.
        assert_eq!(doc["paths"]["/v1/healthz"]["get"]["security"], serde_json::json!([{}]));
        assert_eq!(doc["security"], serde_json::json!([{"bearer": []}]));
        assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    }
}
