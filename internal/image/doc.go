// Package image is airlock's local OCI image store.
//
// A Store is a directory laid out as an OCI image layout
// (https://github.com/opencontainers/image-spec/blob/main/image-layout.md):
//
//	DIR/oci-layout          {"imageLayoutVersion":"1.0.0"}
//	DIR/index.json          the name index: one descriptor per name
//	DIR/blobs/sha256/<hex>  content-addressed blobs (manifests, configs, layers)
//	DIR/lock, DIR/gc.lock   flock(2) lock files shared by all processes
//	DIR/locks/<hex>.lock    per-blob download locks
//	DIR/tmp/                temporary files, renamed into blobs/ once verified
//
// Each index.json entry carries the normalized reference in the standard
// annotation "org.opencontainers.image.ref.name" (for example
// "docker.io/library/python:slim") and where the image came from in
// "run.airlock.image.source" ("pulled from ...", "imported from ...", "built
// locally from ..."), so other OCI tools can read the store too.
//
// Every blob is verified against its digest (and size, when known) before it
// is renamed into blobs/, and again while it is read back through
// Layer.Open. Images come in with Pull (a registry), Import (an OCI layout
// folder, an OCI archive or a "docker save" tarball) or WriteImage (images
// built in-process, see package imagebuild); Save writes a "docker
// save"-compatible tarball.
package image
