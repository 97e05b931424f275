// examples/go: stream a completion from libvllm through cgo. A goroutine pulls the
// request's events with vllm_request_next and sends them into a channel; main prints
// them as they arrive.
//
// It finds libvllm through pkg-config: an installed one (make install, or pip install
// with PKG_CONFIG_PATH=$(python -m libvllm.capi --pkg-config-path)), or a checkout's build/:
//
//	make build/libvllm.so
//	cd examples/go && PKG_CONFIG_PATH=../../build go build -o generate .
//	./generate MODEL.gguf "The capital of France is"
package main

/*
#cgo pkg-config: libvllm
#include <stdlib.h>
#include "vllm.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"
)

// Event is one streamed step of a request, copied out of the library's memory.
type Event struct {
	Text         string
	Tokens       []int32
	Finished     bool
	FinishReason int32
	Err          error
}

// lastError turns a failed status into an error. Call it on the OS thread that made
// the failing call (runtime.LockOSThread): the message is thread-local.
func lastError(status C.vllm_status) error {
	n := C.vllm_last_error_copy(nil, 0)
	buf := make([]byte, n+1)
	C.vllm_last_error_copy((*C.char)(unsafe.Pointer(&buf[0])), C.size_t(len(buf)))
	return fmt.Errorf("%s: %s", C.GoString(C.vllm_status_string(status)), string(buf[:n]))
}

// Engine is a loaded model with its background loop running.
type Engine struct{ handle *C.vllm_engine }

func NewEngine(modelPath string, maxModelLen int32) (*Engine, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var params C.vllm_engine_params
	C.vllm_engine_params_init(&params, C.size_t(unsafe.Sizeof(params)))
	params.max_model_len = C.int32_t(maxModelLen)
	path := C.CString(modelPath)
	defer C.free(unsafe.Pointer(path))
	e := &Engine{}
	if st := C.vllm_engine_create(path, &params, &e.handle); st != C.VLLM_OK {
		return nil, lastError(st)
	}
	if st := C.vllm_engine_start_loop(e.handle); st != C.VLLM_OK {
		err := lastError(st)
		C.vllm_engine_free(e.handle)
		return nil, err
	}
	return e, nil
}

func (e *Engine) Close() { C.vllm_engine_free(e.handle) }

// CheckHealth is nil while the engine can run; an error (VLLM_ERR_ENGINE_DEAD and the
// reason) once its loop failed or its engine-core process died. Since ABI 1.3.
func (e *Engine) CheckHealth() error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if st := C.vllm_engine_check_health(e.handle); st != C.VLLM_OK {
		return lastError(st)
	}
	return nil
}

// Generate submits a greedy request and returns a channel of its events; the channel
// closes after the last one.
func (e *Engine) Generate(id, prompt string, maxTokens int32) (<-chan Event, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var sp C.vllm_sampling_params
	C.vllm_sampling_params_init(&sp, C.size_t(unsafe.Sizeof(sp)))
	sp.temperature = 0
	sp.max_tokens = C.int32_t(maxTokens)
	cid, cprompt := C.CString(id), C.CString(prompt)
	defer C.free(unsafe.Pointer(cid))
	defer C.free(unsafe.Pointer(cprompt))
	var request *C.vllm_request
	if st := C.vllm_request_submit(e.handle, cid, cprompt, nil, 0, &sp, nil, nil, &request); st != C.VLLM_OK {
		return nil, lastError(st)
	}
	events := make(chan Event, 16)
	go pull(request, events)
	return events, nil
}

func pull(request *C.vllm_request, events chan<- Event) {
	runtime.LockOSThread() // vllm_request_next and its error message on one OS thread
	defer runtime.UnlockOSThread()
	defer close(events)
	defer C.vllm_request_free(request)
	for {
		var ev *C.vllm_event
		st := C.vllm_request_next(request, -1, &ev)
		if st == C.VLLM_END_OF_STREAM {
			return
		}
		if st != C.VLLM_OK {
			events <- Event{Finished: true, Err: lastError(st)}
			return
		}
		out := Event{
			Text:         C.GoString(ev.text),
			Finished:     ev.finished != 0,
			FinishReason: int32(ev.finish_reason),
		}
		if ev.n_token_ids > 0 {
			ids := unsafe.Slice((*int32)(unsafe.Pointer(ev.token_ids)), int(ev.n_token_ids))
			out.Tokens = append([]int32(nil), ids...)
		}
		if ev.status != C.VLLM_OK {
			out.Err = errors.New(C.GoString(ev.error))
		}
		events <- out // ev is valid until the next vllm_request_next: copied above
	}
}

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintf(os.Stderr, "usage: %s MODEL.gguf PROMPT\n", os.Args[0])
		os.Exit(2)
	}
	code := run(os.Args[1], os.Args[2])
	C.vllm_shutdown() // before exit: the embedded runtime has no exit hooks
	os.Exit(code)
}

func run(modelPath, prompt string) int {
	engine, err := NewEngine(modelPath, 1024)
	if err != nil {
		fmt.Fprintln(os.Stderr, "engine:", err)
		return 1
	}
	defer engine.Close()
	events, err := engine.Generate("go-0", prompt, 32)
	if err != nil {
		fmt.Fprintln(os.Stderr, "generate:", err)
		return 1
	}
	tokens := 0
	for ev := range events {
		if ev.Err != nil {
			fmt.Fprintln(os.Stderr, "stream:", ev.Err)
			return 1
		}
		fmt.Print(ev.Text)
		tokens += len(ev.Tokens)
	}
	if err := engine.CheckHealth(); err != nil {
		fmt.Fprintln(os.Stderr, "health:", err)
		return 1
	}
	fmt.Printf("\n[%d tokens]\n", tokens)
	return 0
}
