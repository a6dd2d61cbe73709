package e2b

//go:generate go run github.com/bufbuild/buf/cmd/buf@v1.75.0 generate
