// Row invariance of llama.cpp's batched CPU pass: is row i of a k-row pass bit-identical to a one-row pass at the
// same position (what exact verification needs), and what does a k-row pass cost against one row?
// Build against llama.cpp built by build_llama_server.sh with -DBUILD_SHARED_LIBS=ON and the target 'llama':
//   gcc -O2 bench/scripts/llama_row_invariance.c -I$L/include -I$L/ggml/include -L$B -lllama -lggml -lggml-base -lm -Wl,-rpath,$B
// Run: ./a.out MODEL.gguf USE_EXTRA_BUFTS(0|1: weight repacking) FLASH_ATTN(0|1) [PROMPT_TOKENS=200]
// Results: docs/results.md.
#include "llama.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void decode(struct llama_context*ctx,const int*toks,int n,int pos0,int all){
  struct llama_batch b=llama_batch_init(n,0,1);
  for(int i=0;i<n;i++){b.token[i]=toks[i];b.pos[i]=pos0+i;b.n_seq_id[i]=1;b.seq_id[i][0]=0;b.logits[i]=all||i==n-1;}
  b.n_tokens=n; if(llama_decode(ctx,b)){fprintf(stderr,"decode failed\n");exit(1);} llama_batch_free(b);}
int main(int argc,char**argv){
  int extra=atoi(argv[2]), fa=atoi(argv[3]); int P=argc>4?atoi(argv[4]):200;
  llama_backend_init();
  struct llama_model_params mp=llama_model_default_params(); mp.use_extra_bufts=extra;
  struct llama_model*m=llama_model_load_from_file(argv[1],mp);
  struct llama_context_params cp=llama_context_default_params(); cp.n_ctx=4096; cp.n_batch=512; cp.n_ubatch=512;
  cp.n_threads=2; cp.n_threads_batch=2; cp.flash_attn_type=fa; 
  struct llama_context*ctx=llama_init_from_model(m,cp);
  const struct llama_vocab*v=llama_model_get_vocab(m); int nv=llama_vocab_n_tokens(v);
  int toks[4096]; for(int i=0;i<P+64;i++) toks[i]=(1000+i*7919)%30000;
  decode(ctx,toks,P,0,0);
  llama_memory_t mem=llama_get_memory(ctx);
  int ks[]={1,2,3,4,8,16,32};
  float*ref=malloc(sizeof(float)*nv*32);
  // one-row reference
  double t0=now();
  for(int i=0;i<32;i++){decode(ctx,toks+P+i,1,P+i,1); memcpy(ref+(size_t)i*nv,llama_get_logits_ith(ctx,-1),sizeof(float)*nv);}
  double one=(now()-t0)/32;
  llama_memory_seq_rm(mem,0,P,-1);
  printf("extra_bufts=%d flash_attn=%d one-row pass %.1f ms\n",extra,fa,one*1e3);
  for(int j=0;j<7;j++){int k=ks[j]; double best=1e9;
    for(int r=0;r<3;r++){ t0=now(); decode(ctx,toks+P,k,P,1); double dt=now()-t0; if(dt<best)best=dt;
      float md=0; for(int i=0;i<k;i++){float*l=llama_get_logits_ith(ctx,i); for(int q=0;q<nv;q++){float d=fabsf(l[q]-ref[(size_t)i*nv+q]); if(d>md)md=d;}}
      if(r==0) printf("k=%2d max|diff|=%.6f ",k,md);
      llama_memory_seq_rm(mem,0,P,-1);}
    printf("pass %.1f ms (%.2fx one row)\n",best*1e3,best/one);}
  return 0;}
