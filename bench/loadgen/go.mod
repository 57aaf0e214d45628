module oz0/bench/loadgen

go 1.26.8

require (
	github.com/gorilla/websocket v1.5.3
	golang.org/x/sys v0.47.0
)
