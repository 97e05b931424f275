module libvllm.example/generate

go 1.19
