package apiserver

import (
	"net/http"

	"k8s.io/apiserver/pkg/server/routine"
)

// serveThen serves req with handler, then runs done once the response is
// complete. With APIServingWithRoutine a watch's handler returns before
// the watch is served: it leaves the serving as a task that the generic
// server runs once the handler chain has returned, on a smaller stack, and
// done then runs after that task. A panic in handler runs done at once.
func serveThen(handler http.Handler, w http.ResponseWriter, req *http.Request, done func()) {
	served := false
	defer func() {
		if !served {
			done()
		}
	}()
	handler.ServeHTTP(w, req)
	served = true
	if !routine.AppendTask(req.Context(), &routine.Task{Func: done}) {
		done()
	}
}
