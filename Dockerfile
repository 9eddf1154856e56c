# load-control image for docker / buildah users: the binaries (api, operator, loadctl), CA
# certificates, non-root.
#   docker build -t load-control:0.1.0 .
# scripts/image builds the same image offline (no daemon, no registry) from local binaries.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p load-control-api -p load-control-operator -p loadctl \
 && install -D -m 0755 target/release/load-control-api /out/usr/local/bin/load-control-api \
 && install -D -m 0755 target/release/load-control-operator /out/usr/local/bin/load-control-operator \
 && install -D -m 0755 target/release/loadctl /out/usr/local/bin/loadctl \
 && printf 'logging:\n  format: json\n' > /out/config.yaml

# distroless/cc: glibc, libgcc, CA certificates and the nonroot user (65532), nothing else.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/usr/local/bin/ /usr/local/bin/
COPY --from=build /out/config.yaml /etc/load-control/config.yaml
ENV LCA_CONFIG=/etc/load-control/config.yaml
USER 65532:65532
CMD ["load-control-api", "--help"]
