# load-control image for docker / buildah users: the binaries (api, operator, loadctl), CA
# certificates, non-root.
#   docker build -t load-control:0.2.0 .
# scripts/image builds the same filesystem offline (no daemon, no registry) from local binaries:
# /usr/local/bin/{load-control-api,load-control-operator,loadctl}, /etc/load-control/config.yaml,
# user 65532.
#
# Base images: pin them by digest in production (FROM image:tag@sha256:…). To update a pin, read
# the current digest with `docker buildx imagetools inspect rust:1.95-bookworm` (and
# gcr.io/distroless/cc-debian12:nonroot) and replace it here; the tag stays for readers.

# Dependencies are built in their own layer (cargo-chef): a change to our sources rebuilds only
# our crates, not the ~400 dependencies.
FROM rust:1.95-bookworm AS chef
RUN cargo install cargo-chef --locked --version 0.1.78
WORKDIR /src

FROM chef AS plan
COPY . .
RUN cargo chef prepare --recipe-path recipe.json

FROM chef AS build
COPY --from=plan /src/recipe.json recipe.json
RUN cargo chef cook --release --locked --recipe-path recipe.json \
    -p load-control-api -p load-control-operator -p loadctl
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
