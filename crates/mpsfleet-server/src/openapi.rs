//! What every route of the OpenAPI 3.1 document shares: the error answers and the bearer
//! scheme.
//!
//! The document itself is generated from the code: each handler under `api/` carries its
//! `#[utoipa::path]` (method, path, parameters, body, answer), each type its derived schema,
//! and `api::ApiPaths` lists the handlers next to the router, where the document is built
//! (`api::document`) and served at `GET /v1/openapi.json`. A route the router serves that the
//! document does not describe, or the other way round, fails
//! `every_route_of_the_router_is_in_the_document` there; `scripts/fuzz-api.sh` validates the
//! document and fuzzes the server against it.

use std::collections::BTreeMap;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{ContentBuilder, OpenApi as Document, Ref, RefOr};

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
