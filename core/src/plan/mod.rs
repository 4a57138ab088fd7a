//! The plan: Brand's protocol and the other policies, from metadata only.
