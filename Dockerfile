# syntax=docker/dockerfile:1
# Build: docker build -t prefixlb .
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/prefixlb .

# Static binary on a distroless base: no shell, no package manager, runs as uid 65532.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/prefixlb /prefixlb
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["/prefixlb"]
CMD ["serve", "--config", "/etc/prefixlb/prefixlb.yaml"]
