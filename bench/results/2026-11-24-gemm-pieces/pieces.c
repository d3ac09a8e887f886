#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
void openblas_set_num_threads(int);
static double cpu(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+1e-9*t.tv_nsec;}
static void run(int M,int N,int K,int ta,int tb,int pieces){
  float *A=malloc(sizeof(float)*M*K),*B=malloc(sizeof(float)*K*N),*C=malloc(sizeof(float)*M*N);
  for(long i=0;i<(long)M*K;i++)A[i]=(i%7)*0.1f; for(long i=0;i<(long)K*N;i++)B[i]=(i%5)*0.1f;
  double best=1e9;
  for(int r=0;r<7;r++){double t0=cpu();
    int side=N>M?N:M, blk=(side+pieces-1)/pieces;
    for(int p=0;p<pieces;p++){int c0=p*blk,c1=c0+blk<side?c0+blk:side; if(c0>=c1)continue;
      if(N>M){ const float*b=tb?B+(long)c0*K:B+c0; cblas_sgemm(CblasRowMajor,ta?CblasTrans:CblasNoTrans,tb?CblasTrans:CblasNoTrans,M,c1-c0,K,1,A,ta?M:K,b,tb?K:N,0,C+c0,N);}
      else { const float*a=ta?A+c0:A+(long)c0*K; cblas_sgemm(CblasRowMajor,ta?CblasTrans:CblasNoTrans,tb?CblasTrans:CblasNoTrans,c1-c0,N,K,1,a,ta?M:K,B,tb?K:N,0,C+(long)c0*N,N);} }
    double t=cpu()-t0; if(t<best)best=t;}
  printf("M=%d N=%d K=%d ta=%d tb=%d pieces=%2d: %.2f ms  %.1f GF/s\n",M,N,K,ta,tb,pieces,best*1e3,2.0*M*N*K/best*1e-9);
  free(A);free(B);free(C);}
int main(){openblas_set_num_threads(1);
 int sh[][5]={{1024,1024,256,0,0},{1024,256,1024,0,0},{256,256,1024,1,0},{1024,256,256,0,1},{1024,512,256,0,0}};
 for(int s=0;s<5;s++) for(int p=1;p<=16;p*=4) run(sh[s][0],sh[s][1],sh[s][2],sh[s][3],sh[s][4],p);}
