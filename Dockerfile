# The image users deploy: the static binary `make build` writes, and the
# nonroot user's passwd and group entries, on scratch. The binary needs
# nothing else in a pod: every TLS connection it makes trusts a CA it is
# given (the ServiceAccount's, etcd's), it logs in UTC, and the runtime
# mounts /etc/hosts and /etc/resolv.conf. docker build -t <image> . after
# make build; make image builds the same image without a container engine,
# reading this file (hack/image), so that the two cannot differ.
FROM scratch
COPY build/image/etc/passwd build/image/etc/group /etc/
COPY bin/cached-apiserver /cached-apiserver
USER 65532:65532
ENTRYPOINT ["/cached-apiserver"]
