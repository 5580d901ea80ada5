//! Deployment-style controllers built on kinformer. Not built yet.
