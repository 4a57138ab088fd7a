//! Generates the gRPC client and server of the node-to-node service from a
//! Rust description (no .proto file, so no protoc). Messages are the
//! hand-written prost structs in `src/wire.rs`.

fn main() {
    let push = tonic_build::manual::Method::builder()
        .name("push")
        .route_name("Push")
        .input_type("crate::wire::Push")
        .output_type("crate::wire::Credit")
        .codec_path("tonic_prost::ProstCodec")
        .client_streaming()
        .server_streaming()
        .build();
    let service = tonic_build::manual::Service::builder()
        .name("Node")
        .package("brand.nodes")
        .method(push)
        .build();
    tonic_build::manual::Builder::new().compile(&[service]);
}
