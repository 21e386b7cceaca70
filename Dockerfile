# syntax=docker/dockerfile:1
# Build: docker build -t prefixlb:dev .
# The Helm chart (deploy/helm/prefixlb) runs this image, prefixlb:dev, by default.
#
# The Go image's tag is go.mod's go version: the official Go images set GOTOOLCHAIN=local, so
# an older Go in the image would refuse the module instead of fetching a newer toolchain.
FROM golang:1.26.8 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/prefixlb .

# Static binary on a distroless base: no shell, no package manager, runs as uid 65532. prefixlb
# writes no file (logs go to stdout), so the root filesystem can be mounted read-only.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/prefixlb /prefixlb
USER 65532:65532
EXPOSE 8080 9090 7946/tcp 7946/udp
ENTRYPOINT ["/prefixlb"]
CMD ["serve", "--config", "/etc/prefixlb/prefixlb.yaml"]
