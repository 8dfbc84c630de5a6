# Builds the cached-apiserver image. No container engine runs on the
# project's machines, so this file is not built or tested there.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# VERSION is what --version prints, set as make build sets it:
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -ldflags "-X github.com/cached-apiserver/cached-apiserver/pkg/version.Version=${VERSION}" \
    -o /cached-apiserver ./cmd/cached-apiserver

FROM gcr.io/distroless/static:nonroot
COPY --from=build /cached-apiserver /cached-apiserver
USER nonroot
ENTRYPOINT ["/cached-apiserver"]
